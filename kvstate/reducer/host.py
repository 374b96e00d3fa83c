"""The tiered reducer: ``apply_tiered(TieredState, event) -> TieredState`` (pure).

Host events (``Offload``, ``Load``, ``HostFree``) change the host tier, and
``Load`` also the device tree.  Core events go through the core reducer
unchanged; then the host tier follows:

    Insert   refused when the parent has a host-only child with the same child
             key (load that node first: one key, one node)
    Split    a backed-up node's host pages split with it
    Evict    a backed-up node becomes host-only (keeps id, parent and key);
             refused for a node that is not backed up but has a host-only child
    Reset    ``tree`` / ``all`` drop the whole host tier

Invariants kept (named and checked from scratch in :mod:`kvstate.invariants_host`):
a host page is owned by one node at most; backed-up nodes form a root-closed
set; a host-only node keeps its key and hangs off a live parent.  On a plain
``State`` the host events are registered to refuse with a clear message.
"""

from __future__ import annotations

from collections.abc import Callable

from immutables import Map

from kvstate.errors import InvalidEvent
from kvstate.events import Event, Evict, Insert, Reset, Split
from kvstate.events_host import HOST_EVENTS, HostFree, Load, Offload
from kvstate.reducer import Reject, handles
from kvstate.reducer import apply as apply_core
from kvstate.reducer.common import check_distinct, check_time
from kvstate.state import ROOT, Node, State
from kvstate.state_host import HostNode, HostTier, TieredState, empty_host_tier

TierRule = Callable[[TieredState, Event], TieredState]
TIER_RULES: dict[type[Event], TierRule] = {}


def _tier_rule(event_type: type[Event]) -> Callable[[TierRule], TierRule]:
    def register(rule: TierRule) -> TierRule:
        TIER_RULES[event_type] = rule
        return rule

    return register


def _plain_state_refuses(state: State, event: Event) -> State:
    raise Reject(f"{type(event).__name__} needs a host tier: apply it with "
                 "kvstate.reducer.host.apply_tiered on a TieredState")


for _event_type in HOST_EVENTS:
    handles(_event_type)(_plain_state_refuses)


def apply_tiered(state: TieredState, event: Event) -> TieredState:
    """Apply one event to a tiered state; ``InvalidEvent`` (nothing changed) if illegal."""
    rule = TIER_RULES.get(type(event))
    if rule is None:
        core = apply_core(state.core, event)  # raises InvalidEvent itself
        return TieredState(core, state.host)
    try:
        after = rule(state, event)
    except Reject as exc:
        raise InvalidEvent(event, state.core.seq, str(exc)) from None
    if type(event) in HOST_EVENTS:
        after = after.replace(core=after.core.with_changes(seq=state.core.seq + 1))
    return after


def _core(state: TieredState, event: Event) -> State:
    try:
        return apply_core(state.core, event)
    except InvalidEvent as exc:
        raise Reject(exc.precondition) from None


# -- host events ------------------------------------------------------------------
@_tier_rule(Offload)
def offload(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Offload)
    core, host = state.core, state.host
    node = core.nodes.get(event.node)
    if node is None or event.node == ROOT:
        raise Reject(f"node {event.node} is not a device tree node")
    if event.node in host.backup:
        raise Reject(f"node {event.node} is already backed up")
    if node.parent != ROOT and node.parent not in host.backup:
        raise Reject(f"parent {node.parent} of node {event.node} is not backed up "
                     "(backed-up nodes must form a root-closed prefix)")
    if len(event.host_pages) != len(node.pages):
        raise Reject(f"node {event.node} has {len(node.pages)} pages, got "
                     f"{len(event.host_pages)} host pages")
    check_distinct(event.host_pages, "host page")
    for page in event.host_pages:
        if not 0 <= page < host.num_pages:
            raise Reject(f"host page {page} is outside 0..{host.num_pages - 1}")
        if page not in host.free_pages:
            raise Reject(f"host page {page} is owned by node {host.owner.get(page)}")
    owner = host.owner.update({page: event.node for page in event.host_pages})
    new_host = _evolve(host, free_pages=host.free_pages.take(event.host_pages),
                       backup=host.backup.set(event.node, event.host_pages), owner=owner)
    return state.replace(host=new_host)


@_tier_rule(Load)
def load(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Load)
    core, host = state.core, state.host
    record = host.evicted.get(event.node)
    if record is None:
        raise Reject(f"node {event.node} is not a host-only node")
    check_time(core, event.time)
    parent = core.nodes.get(record.parent)
    if parent is None:
        raise Reject(f"parent {record.parent} of node {event.node} is not on the device; "
                     "load the parent first")
    child_key = core.geometry.child_key(record.key)
    if child_key in parent.children:
        raise Reject(f"device node {parent.children[child_key]} already starts with this key")
    if len(event.pages) * core.geometry.page_size != len(record.key):
        raise Reject(f"node {event.node} needs {len(record.key) // core.geometry.page_size} pages, "
                     f"got {len(event.pages)}")
    check_distinct(event.pages, "page")
    for page in event.pages:
        if page not in core.free_pages:
            raise Reject(f"page {page} is not free")
    node = Node(parent=record.parent, key=record.key, pages=tuple(event.pages), children=Map(),
                lock_ref=0, last_access=event.time)
    nodes = core.nodes.update({
        record.parent: parent._replace(children=parent.children.set(child_key, event.node)),
        event.node: node,
    })
    page_node = core.page_node.update({page: event.node for page in event.pages})
    leaves = core.leaves  # the loaded node is an unlocked leaf; its parent no longer is
    if record.parent in leaves:
        leaves = leaves.delete(record.parent)
    new_core = core.with_changes(nodes=nodes, page_node=page_node,
                                 free_pages=core.free_pages.take(event.pages), clock=event.time,
                                 evictable_size=core.evictable_size + len(record.key),
                                 leaves=leaves.set(event.node, None))
    new_host = _evolve(host, evicted=host.evicted.delete(event.node),
                       evicted_children=host.evicted_children.delete((record.parent, child_key)))
    return TieredState(new_core, new_host)


@_tier_rule(HostFree)
def host_free(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, HostFree)
    check_distinct(event.nodes, "node")
    core, host = state.core, state.host
    for node_id in event.nodes:
        pages = host.backup.get(node_id)
        if pages is None:
            raise Reject(f"node {node_id} has no host copy")
        if host.host_children(node_id):
            raise Reject(f"node {node_id} still has host-only children")
        device = core.nodes.get(node_id)
        if device is not None and any(c in host.backup for c in device.children.values()):
            raise Reject(f"node {node_id} has backed-up children (root-closed backups)")
        owner = host.owner.mutate()
        for page in pages:
            del owner[page]
        evicted, children = host.evicted, host.evicted_children
        record = evicted.get(node_id)
        if record is not None:
            evicted = evicted.delete(node_id)
            children = children.delete((record.parent, core.geometry.child_key(record.key)))
        queue = host.free_pages.push_head(pages) if event.at_head else host.free_pages.push_tail(pages)
        host = _evolve(host, free_pages=queue, backup=host.backup.delete(node_id),
                       owner=owner.finish(), evicted=evicted, evicted_children=children)
    return state.replace(host=host)


# -- core events the host tier follows ----------------------------------------------------
@_tier_rule(Insert)
def insert(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Insert)
    if not event.key:
        return state.replace(core=_core(state, event))  # the core refuses an empty key
    child_key = state.core.geometry.child_key(event.key)
    hidden = state.host.evicted_children.get((event.parent, child_key))
    if hidden is not None:
        raise Reject(f"host-only node {hidden} already starts with this key under node "
                     f"{event.parent}; load it back first")
    return state.replace(core=_core(state, event))


@_tier_rule(Split)
def split(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Split)
    core = _core(state, event)
    host = state.host
    pages = host.backup.get(event.node)
    if pages is None:
        return state.replace(core=core)
    cut = event.at // state.core.geometry.page_size
    top, bottom = pages[:cut], pages[cut:]
    owner = host.owner.update({page: event.new_node for page in top})
    backup = host.backup.update({event.new_node: top, event.node: bottom})
    return TieredState(core, _evolve(host, backup=backup, owner=owner))


@_tier_rule(Evict)
def evict(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Evict)
    before, host = state.core, state.host
    core = _core(state, event)
    evicted, children = host.evicted, host.evicted_children
    for node_id in event.nodes:
        node = before.nodes[node_id]
        if node_id not in host.backup:
            if host.host_children(node_id):
                raise Reject(f"node {node_id} has host-only children but no host copy")
            continue
        evicted = evicted.set(node_id, HostNode(node.parent, node.key, node.last_access))
        children = children.set((node.parent, before.geometry.child_key(node.key)), node_id)
    return TieredState(core, _evolve(host, evicted=evicted, evicted_children=children))


@_tier_rule(Reset)
def reset(state: TieredState, event: Event) -> TieredState:
    assert isinstance(event, Reset)
    core = _core(state, event)
    if event.scope in ("tree", "all"):
        return TieredState(core, empty_host_tier(state.host.num_pages))
    return state.replace(core=core)


def _evolve(host: HostTier, **changes: object) -> HostTier:
    fields = {"num_pages": host.num_pages, "free_pages": host.free_pages, "backup": host.backup,
              "owner": host.owner, "evicted": host.evicted,
              "evicted_children": host.evicted_children}
    fields.update(changes)
    return HostTier(**fields)  # type: ignore[arg-type]


# -- invariants ------------------------------------------------------------------------------
