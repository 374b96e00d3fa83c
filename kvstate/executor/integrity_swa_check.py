"""Reading the SWA layers back: the incremental check and the full verification.

Helpers of :class:`~kvstate.executor.integrity_swa.SwaMonitor` (read-only on
the buffers and the state; they consume its dirty sets).  A *read* is a
token that must find, at the SWA slot of its FULL slot, the tags of what
``bound`` says was computed there for its position:

* every live (not dangling) request position and every tree token whose FULL
  page has an SWA page;
* with a known window ``W``, every position of a request's last ``W`` must
  have one: a window position whose page lost its SWA page (freed, evicted,
  moved by a rebind) is a lost window token, unless that page's free is
  still pending (:mod:`kvstate.executor.integrity_swa`).

The incremental check looks at the readers of FULL pages whose pairing or
SWA bytes changed, the request entries mapped since the last check and the
windows of truncated requests; like the FULL check it settles a read without
touching the buffers when the monitor knows what the SWA slot holds, and
reads the rest back (every SWA layer, K and V, as integer words).  The full
verification reads every request through SGLang's SWA-translated
``req_to_token`` (through the executor's mapping and through the state's
pairing), through an attached ``ReqToTokenPool``'s own table and the
mapping, and through the window indices, and every live tree token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from kvstate.executor.integrity_tags import Content
from kvstate.state import ROOT, RequestId, slot_span

Reads = dict[tuple[Any, ...], tuple[int, Content]]  # label -> (SWA slot, expected content)


def _request_reads(swa: Any, request_id: RequestId, positions: Iterable[int], reads: Reads,
                   problems: list[str]) -> None:
    """Expectations of request positions (through the plans' table and pairing)."""
    tables = swa.monitor.tables_of(request_id)
    if tables is None:
        return
    tokens, pages, dangling = tables
    size, window, peer, bound = swa.size, swa.window, swa.peer, swa.bound
    start = len(tokens) - window if window is not None else len(tokens)
    for position in positions:
        index = position // size
        if position >= len(tokens) or index >= len(pages) or index in dangling:
            continue
        full = pages[index]
        slot = full * size + position % size
        page = peer.get(full)
        if page is None:
            if position >= start and not swa.in_flight(full):
                problems.append(f"SWA window lost: request {request_id!r} position {position} "
                                f"(of {len(tokens)}, window {window}) maps FULL slot {slot}, "
                                "whose page has no SWA page (freed or evicted)")
            continue
        known = bound.get(slot)
        if known is None or known[1] != position:
            problems.append(f"request {request_id!r} position {position}: the SWA slot of FULL "
                            f"slot {slot} holds no KV computed for it "
                            f"({'nothing' if known is None else f'position {known[1]}'})")
            continue
        reads[("r", request_id, position)] = (page * size + position % size, known)


def _node_reads(swa: Any, node_id: int, index: int, full: int, reads: Reads,
                problems: list[str]) -> None:
    """Expectations of the tokens of tree node ``node_id``'s ``index``-th page (if paired)."""
    page = swa.peer.get(full)
    tokens = swa.monitor.node_content.get(node_id)
    if page is None or tokens is None:
        return
    size = swa.size
    for offset in range(size):
        token = index * size + offset
        position = tokens[token][1]
        known = swa.bound.get(full * size + offset)
        if known is None or known[1] != position:
            problems.append(f"tree node {node_id} token {token} (position {position}): its SWA "
                            f"slot holds no KV computed for it "
                            f"({'nothing' if known is None else f'position {known[1]}'})")
            continue
        reads[("n", node_id, token)] = (page * size + offset, known)


def _window(swa: Any, request_id: RequestId) -> range:
    length = len(swa.monitor.req_content.get(request_id, ()))
    window = swa.window
    return range(max(0, length - window) if window is not None else 0, length)


def check_swa(swa: Any, state: Any, problems: list[str]) -> int:
    """The incremental check of the SWA side; token reads (x SWA layers) made."""
    monitor, size = swa.monitor, swa.size
    readers, tree_page = monitor.readers, monitor.tree_page
    state_peer = state.swa.peer
    wanted: dict[RequestId, set[int]] = {}  # each position looked at once
    nodes: dict[int, tuple[int, int]] = {}
    for full in swa.pages:
        if state_peer.get(full) != swa.peer.get(full):
            problems.append(f"FULL page {full}: the state pairs it with SWA page "
                            f"{state_peer.get(full)}, the executor's plans with "
                            f"{swa.peer.get(full)}")
        for request_id, index in (readers.get(full) or {}).items():
            wanted.setdefault(request_id, set()).update(range(index * size, index * size + size))
        entry = tree_page.get(full)
        if entry is not None:
            nodes[full] = entry
    for request_id in swa.rewindow:
        wanted.setdefault(request_id, set()).update(_window(swa, request_id))
    reads: Reads = {}
    req_pages = monitor.req_pages
    for request_id, position, slot in swa.tokens:  # entries mapped since: if they still are
        pages = req_pages.get(request_id)
        if pages is not None and position // size < len(pages) and \
                pages[position // size] == slot // size and (
                    request_id not in wanted or position not in wanted[request_id]):
            _request_reads(swa, request_id, (position,), reads, problems)
    for request_id, positions in wanted.items():
        _request_reads(swa, request_id, sorted(positions), reads, problems)
    for full, (node_id, index) in nodes.items():
        _node_reads(swa, node_id, index, full, reads, problems)
    checked = settle(swa, reads, problems)
    checked += _poisoned(swa, problems)
    swa.clear_dirty()
    return checked


def _poisoned(swa: Any, problems: list[str]) -> int:
    """SWA pages freed since the last check and not paired again hold the poison."""
    if not swa.freed or not swa.executor.poison_freed:
        return 0
    size, moved, owner = swa.size, swa.moved, swa.owner
    freed = swa.freed if size == 1 else {slot // size for slot in swa.freed}
    pages = [page for page in sorted(freed) if page not in owner
             and all(slot in moved for slot in range(page * size, page * size + size))]
    if not pages:
        return 0
    bad = swa.layout.unpoisoned_pages(pages)
    if bad:
        problems.append(f"freed SWA page {bad[0]} is not poisoned ({len(bad)} pages)")
    return len(pages) * size * swa.layers


def settle(swa: Any, reads: Reads, problems: list[str]) -> int:
    """Settle every read: known SWA contents compare in Python, the rest are read back."""
    if not reads:
        return 0
    content, moved = swa.content, swa.moved
    labels = [label for label, (slot, known) in reads.items()
              if slot in moved or content.get(slot) != known]
    if labels:
        _compare(swa, "", labels, [reads[label][0] for label in labels],
                 [reads[label][1] for label in labels], problems)
    return len(reads) * swa.layers


def _compare(swa: Any, through: str, labels: list[tuple[Any, ...]], slots: list[int],
             contents: list[Content], problems: list[str]) -> None:
    """Read ``slots`` back (every SWA layer) against the tags of ``contents``."""
    bad = swa.layout.mismatches(slots, contents)
    for row in bad[:8]:
        label = labels[row]
        layer = swa.model_layers[swa.layout.first_bad_layer(slots[row], contents[row])]
        who = (f"request {label[1]!r} position {label[2]}" if label[0] == "r" else
               f"tree node {label[1]} token {label[2]}")
        problems.append(f"SWA layer {layer}{through}: {who} reads another token's tag "
                        f"(SWA slot {slots[row]})")
    if len(bad) > 8:
        problems.append(f"... {len(bad) - 8} more bad SWA reads{through}")


def verify_swa(swa: Any, state: Any, problems: list[str]) -> int:
    """Every request position and tree token the SWA layers may read, read back through
    the SWA exports (the executor's mapping and the state's pairing) and the pairing."""
    monitor = swa.monitor
    state_peer = state.swa.peer
    if len(state_peer) != len(swa.peer) or any(swa.peer.get(f) != p
                                               for f, p in state_peer.items()):
        problems.append("the state's SWA pairing differs from the executor's plans "
                        f"({len(state_peer)} pairs in the state, {len(swa.peer)} planned)")
    reads: Reads = {}
    for request_id in state.requests.keys():
        if request_id in monitor.req_content:
            _request_reads(swa, request_id, range(len(monitor.req_content[request_id])), reads,
                           problems)
    for node_id in state.nodes.keys():
        if node_id != ROOT:
            for index, full in enumerate(monitor.node_pages.get(node_id, ())):
                _node_reads(swa, node_id, index, full, reads, problems)
    checked = _export_reads(swa, state, reads, problems)
    nodes = [label for label in reads if label[0] == "n"]
    if nodes:
        _compare(swa, "", nodes, [reads[label][0] for label in nodes],
                 [reads[label][1] for label in nodes], problems)
        checked += len(nodes) * swa.layers
    swa.clear_dirty()
    return checked


def _export_reads(swa: Any, state: Any, reads: Reads, problems: list[str]) -> int:
    """Request reads through ``sglang_swa_req_to_token`` and ``swa_window_indices``, each
    through the executor's ``full_to_swa_index_mapping`` and through the state's pairing."""
    from kvstate.executor.exports import sglang_swa_req_to_token, swa_slots, swa_window_indices

    wanted: dict[RequestId, list[tuple[int, Content]]] = {}
    for label, (_slot, known) in reads.items():
        if label[0] == "r":
            wanted.setdefault(label[1], []).append((label[2], known))
    if not wanted:
        return 0
    requests = list(wanted)
    whole = [r for r in requests if not state.requests[r].dangling]
    size = swa.size
    checked = 0
    mapping = swa.executor.full_to_swa_index_mapping
    for name, chosen in ((" (state pairing)", None), (" (full_to_swa_index_mapping)", mapping)):
        labels: list[tuple[Any, ...]] = []
        slots: list[int] = []
        contents: list[Content] = []
        rows = sglang_swa_req_to_token(state, whole, mapping=chosen).tolist() if whole else []
        for row, request_id in zip(rows, whole, strict=True):
            for position, known in wanted[request_id]:
                labels.append(("r", request_id, position))
                slots.append(row[position])
                contents.append(known)
        for request_id in requests:
            if state.requests[request_id].dangling:  # read its live positions one by one
                pages = state.requests[request_id].pages
                full = [slot_span(pages, size, p, p + 1)[0] for p, _ in wanted[request_id]]
                slots.extend(swa_slots(state, full, mapping=chosen))
                for position, known in wanted[request_id]:
                    labels.append(("r", request_id, position))
                    contents.append(known)
        _compare(swa, f" via sglang_swa_req_to_token{name}", labels, slots, contents, problems)
        checked += len(slots) * swa.layers
    pool = swa.monitor.request_pool
    if pool is not None and all(isinstance(r, int) for r in requests):  # the front end's table
        labels = [("r", r, p) for r in requests for p, _ in wanted[r]]
        table = pool.req_to_token
        full = table[torch.tensor([label[1] for label in labels], device=table.device),
                     torch.tensor([label[2] for label in labels], device=table.device)]
        slots = swa_slots(state, full.tolist(), mapping=mapping)
        _compare(swa, " via ReqToTokenPool.req_to_token and full_to_swa_index_mapping", labels,
                 slots, [known for r in requests for _, known in wanted[r]], problems)
        checked += len(slots) * swa.layers
    window = swa.window
    if window is not None and whole:
        indptr, indices = swa_window_indices(state, whole, window, mapping=mapping)
        bounds, flat = indptr.tolist(), indices.tolist()
        labels, slots, contents = [], [], []
        for number, request_id in enumerate(whole):
            first = len(swa.monitor.req_content[request_id]) - (bounds[number + 1] - bounds[number])
            for position, known in wanted[request_id]:
                if position >= first:
                    labels.append(("r", request_id, position))
                    slots.append(flat[bounds[number] + position - first])
                    contents.append(known)
        _compare(swa, " via swa_window_indices", labels, slots, contents, problems)
        checked += len(slots) * swa.layers
    return checked
