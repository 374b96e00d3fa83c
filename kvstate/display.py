"""Readable printouts of a state: summary, tree, one request, pages.

Used by ``kvstate replay --show`` and ``RadixCache.pretty_print``.  Pure
formatting: each function reads a frozen ``State`` or a ``LiveState`` and
returns text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvstate.canonical import fingerprint
from kvstate.state import DETACHED, ROOT, RequestId, slots_of

State = Any  # a frozen State or a LiveState


def ranges(values: Iterable[int]) -> str:
    """``1-4,7,9-10`` for the given order (runs of +1 are folded)."""
    parts: list[str] = []
    run_start = previous = None
    for value in values:
        if previous is not None and value == previous + 1:
            previous = value
            continue
        if run_start is not None:
            parts.append(_run(run_start, previous))
        run_start = previous = value
    if run_start is not None:
        parts.append(_run(run_start, previous))
    return ",".join(parts) if parts else "-"


def _run(first: int, last: int | None) -> str:
    return str(first) if last is None or last == first else f"{first}-{last}"


def show_state(state: State) -> str:
    g = state.geometry
    used = g.num_pages - len(state.free_pages)
    return "\n".join([
        f"seq {state.seq}  clock {state.clock}  fingerprint {fingerprint(state).hex()}",
        f"geometry: {g.num_pages} pages x {g.page_size} tokens, {g.num_rows} rows, "
        f"row width {g.row_width}",
        f"pages: {used} used, {len(state.free_pages)} free "
        f"(tree {len(state.page_node)}, held by requests/detached {len(state.holders)})",
        f"requests open: {len(state.requests)}  free rows: {len(state.free_rows)}",
        f"tree: {len(state.nodes) - 1} nodes, {state.evictable_size + state.protected_size} tokens "
        f"(evictable {state.evictable_size}, protected {state.protected_size}), "
        f"next node id {state.next_node_id}",
    ])


def show_tree(state: State, max_tokens: int = 12) -> str:
    """Indented tree: ``#id len=.. key=[..] pages=[..] lock=.. t=..``, children by id."""
    lines: list[str] = []
    stack = [(ROOT, 0)]
    while stack:
        node_id, depth = stack.pop()
        node = state.nodes[node_id]
        if node_id == ROOT:
            lines.append(f"root  tokens={state.evictable_size + state.protected_size} "
                         f"(evictable {state.evictable_size}, "
                         f"protected {state.protected_size})")
        else:
            key = list(node.key[:max_tokens])
            more = f"... (+{len(node.key) - max_tokens})" if len(node.key) > max_tokens else ""
            lines.append(f"{'  ' * depth}#{node_id} len={len(node.key)} key={key}{more} "
                         f"pages=[{ranges(node.pages)}] lock={node.lock_ref} t={node.last_access}")
        stack.extend((child, depth + 1) for child in sorted(node.children.values(), reverse=True))
    return "\n".join(lines)


def parse_request_id(text: str) -> RequestId:
    return int(text) if text.lstrip("-").isdigit() else text


def show_request(state: State, request_id: RequestId, max_slots: int = 64) -> str:
    record = state.requests.get(request_id)
    if record is None:
        open_ids = sorted(str(r) for r in state.requests.keys())
        return f"request {request_id!r} is not open (open: {', '.join(open_ids) or 'none'})"
    slots = slots_of(state, request_id, 0, min(record.allocated, max_slots))
    more = f" ... (+{record.allocated - max_slots})" if record.allocated > max_slots else ""
    owned = [p for p in record.pages if request_id in state.holders.get(p, ())]
    tree = [p for p in record.pages if p in state.page_node]
    return "\n".join([
        f"request {request_id!r}: allocated {record.allocated}, committed {record.committed}",
        f"pages: [{ranges(record.pages)}]",
        f"held by it: [{ranges(owned)}]  tree pages referenced: [{ranges(tree)}]",
        f"slots: {slots}{more}",
    ])


def show_pages(state: State) -> str:
    detached = sorted(p for p, held in state.holders.items() if held == (DETACHED,))
    by_request: dict[str, list[int]] = {}
    for page, held in state.holders.items():
        for holder in held:
            if holder != DETACHED:
                by_request.setdefault(repr(holder), []).append(page)
    lines = [f"free ({len(state.free_pages)}, head first): {ranges(state.free_pages)}",
             f"tree ({len(state.page_node)}): {ranges(sorted(state.page_node.keys()))}",
             f"detached ({len(detached)}): {ranges(detached)}"]
    for holder in sorted(by_request):
        pages = sorted(by_request[holder])
        lines.append(f"request {holder} ({len(pages)}): {ranges(pages)}")
    return "\n".join(lines)
