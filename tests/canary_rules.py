"""Broken variants of the shared rules, one per property (used by tests/test_canaries.py).

Each factory takes the real rule of an event type (``kvstate.rules.RULES``:
``rule(s, event) -> None`` on a store ``s``) and returns a variant that
breaks one thing *through the store interface* (``kvstate.rules.store``), so
the same canary runs on the persistent backend (the explorer) and on the
live backend (the state machines, which run both).  A variant either calls
the real rule and then damages what it wrote, or skips a precondition.  The
classic real bugs are among them: a free that appends a page twice, a lock
not released, evicting a node whose child is locked, a refcount not
decremented, a split that does not copy ``lock_ref``, a stale prefix hit.
"""

from __future__ import annotations

from kvstate.records import HostNode
from kvstate.state import DETACHED, ROOT


def free_keeps_holder(core):
    def rule(s, e):
        core(s, e)
        s.holders[e.pages[0]] = (DETACHED,)
    return rule


def evict_frees_shared_pages(core):
    """A free that appends a page twice: eviction also frees pages a request still holds."""
    def rule(s, e):
        held = [p for n in e.nodes if n in s.nodes for p in s.nodes[n].pages if p in s.holders]
        core(s, e)
        if held:
            s.free_pages = s.free_pages.push_tail(held)
    return rule


def evict_leaves_node(core):
    """A stale prefix hit after eviction: pages go free but the tree still claims them."""
    def rule(s, e):
        owned = {p: n for n in e.nodes if n in s.nodes for p in s.nodes[n].pages}
        core(s, e)
        for page, node_id in owned.items():
            s.page_node[page] = node_id
    return rule


def truncate_keeps_hold(core):
    """A refcount not decremented: a dropped page keeps the request as its holder."""
    def rule(s, e):
        record = s.requests.get(e.request)
        kept = {} if record is None else {p: s.holders[p] for p in record.pages
                                          if p in s.holders}
        core(s, e)
        for page, held in kept.items():
            s.holders[page] = held
    return rule


def req_alloc_keeps_row_free(core):
    def rule(s, e):
        core(s, e)
        rows = [r for r in e.requests if isinstance(r, int)]
        s.free_rows = s.free_rows.push_head(rows)
    return rule


def lock_skips_sizes(core):
    def rule(s, e):
        sizes = s.evictable_size, s.protected_size
        core(s, e)
        s.evictable_size, s.protected_size = sizes
    return rule


def lock_keeps_leaf_index(core):
    """Locking a leaf leaves it in the evictable-leaf index (eviction could pick it)."""
    def rule(s, e):
        core(s, e)
        if e.node != ROOT and not s.nodes[e.node].children:
            s.leaves[e.node] = None
    return rule


def split_drops_lock_ref(core):
    """A split that does not copy lock_ref to the new top node."""
    def rule(s, e):
        core(s, e)
        s.node_w(e.new_node).lock_ref = 0
    return rule


def insert_skips_child_index(core):
    def rule(s, e):
        core(s, e)
        del s.node_w(e.parent).children[s.geometry.child_key(e.key)]
    return rule


def allocate_overcounts(core):
    def rule(s, e):
        core(s, e)
        if e.items:
            s.request_w(e.items[0][0]).allocated += 1
    return rule


def touch_keeps_clock(core):
    def rule(s, e):
        clock = s.clock
        core(s, e)
        s.clock = clock
    return rule


def touch_stamps_everything(core):
    def rule(s, e):
        core(s, e)
        for node_id in list(s.snapshot("nodes").keys()):
            s.node_w(node_id).last_access = e.time
    return rule


def touch_moves_clock_back(core):
    def rule(s, e):
        clock = s.clock
        core(s, e)
        s.clock = max(0, clock - 1)
    return rule


def evict_ignores_locks(core):
    """Evicting a node whose child is locked: no lock or leaf check; the subtree goes too."""
    from kvstate.rules import Reject

    def rule(s, e):
        for node_id in e.nodes:
            if node_id == ROOT or node_id not in s.nodes:
                raise Reject(f"cannot evict node {node_id}")
        for node_id in e.nodes:
            node = s.nodes[node_id]
            del s.node_w(node.parent).children[s.geometry.child_key(node.key)]
            subtree = [node_id]
            for member in subtree:
                subtree.extend(s.nodes[member].children.values())
            for member in subtree:
                pages = s.nodes[member].pages
                for page in pages:
                    del s.page_node[page]
                s.free_pages = s.free_pages.push_tail([p for p in pages if p not in s.holders])
                s.drop_node(member)
    return rule


def evict_ignores_mapping(core):
    """Eviction checks locks and leaves but not whether a request still maps the pages (F1):
    the real rule runs with the ``tree_refs`` entries of the evicted pages hidden."""
    def rule(s, e):
        hidden = {p: s.tree_refs[p] for n in e.nodes if n in s.nodes
                  for p in s.nodes[n].pages if p in s.tree_refs}
        for page in hidden:
            del s.tree_refs[page]
        try:
            core(s, e)
        finally:
            for page, count in hidden.items():
                s.tree_refs[page] = count
    return rule


def req_free_truncates_others(core):
    def rule(s, e):
        core(s, e)
        for rid, record in list(s.snapshot("requests").items()):
            if record.allocated:
                other = s.request_w(rid)
                other.allocated = other.committed = 0
    return rule


def share_skips_holder(core):
    """Share maps the pages but takes no reference on them."""
    def rule(s, e):
        size = s.geometry.page_size
        pages = {slot // size for slot in e.slots}
        old = {p: s.holders.get(p) for p in pages}
        core(s, e)
        for page, held in old.items():
            if held is None:
                del s.holders[page]
            else:
                s.holders[page] = held
    return rule


def share_allows_mapped_page(core):
    """Share accepts a page the request already maps (F5): one slot at two positions."""
    def rule(s, e):
        record = s.requests.get(e.request)
        size = s.geometry.page_size
        pages = sorted({slot // size for slot in e.slots})
        if record is None or not pages or any(p not in record.pages for p in pages):
            core(s, e)
            return
        for page in pages:
            held = s.holders.get(page, ())
            if e.request not in held:
                s.holders[page] = (*held, e.request)
        record = s.request_w(e.request)
        record.pages.extend(pages)
        record.allocated += len(e.slots)
    return rule


# -- the host tier (H1-H3) ------------------------------------------------------------
def offload_leaves_pages_free(core):
    """H1: the backup takes host pages without taking them off the host free list."""
    def rule(s, e):
        core(s, e)
        s.host.free_pages = s.host.free_pages.push_tail(list(e.host_pages))
    return rule


def split_keeps_backup_below(core):
    """H2: a split leaves every host page with the bottom half; the new top has no copy."""
    def rule(s, e):
        pages = s.host.backup.get(e.node) if e.node in s.nodes else None
        core(s, e)
        if pages is not None:
            del s.host.backup[e.new_node]
            s.host.backup[e.node] = pages
            for page in pages:
                s.host.owner[page] = e.node
    return rule


def evict_forgets_key(core):
    """H3: an evicted backed-up node keeps its id but loses its key."""
    def rule(s, e):
        core(s, e)
        for node_id in e.nodes:
            record = s.host.evicted.get(node_id)
            if record is not None:
                s.host.evicted[node_id] = HostNode(record.parent, (), record.last_access)
    return rule
