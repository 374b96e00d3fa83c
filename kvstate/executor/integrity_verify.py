"""Full integrity verification: every live token through every export, the tree, the host.

A helper of :class:`~kvstate.executor.integrity.IntegrityMonitor` (``verify``).
Read-only on the buffers and the state; afterwards the monitor's dirty sets
are cleared (everything was just read) and its errors count as reported.

Reads, every layer, K and V: each open request's live tokens through
``gather_kv``, the FlashInfer page table, vLLM's block table and slot
mapping, SGLang's ``req_to_token`` and an attached ``ReqToTokenPool``; a
request with dangling entries (``FreeMapped``) only through the slot
mapping of its live spans (the whole-row exports refuse a use after free);
every tree token (block mode: every cached copy); every host copy; with an
SWA pool, the sliding-window layers (:mod:`kvstate.executor.integrity_swa_check`).
"""

from __future__ import annotations

from typing import Any

from kvstate.executor.integrity_block import block_tree_reads
from kvstate.executor.integrity_check import IntegrityReport
from kvstate.executor.integrity_host import verify_host
from kvstate.executor.integrity_swa_check import verify_swa
from kvstate.executor.integrity_tags import Content
from kvstate.executor.readback import export_slots, gather_problems, locate
from kvstate.state import ROOT, RequestId, expand_pages


def verify_full(monitor: Any, state: Any) -> IntegrityReport:
    ex, layout = monitor.executor, monitor.layout
    problems = list(monitor.errors)
    requests = list(state.requests.keys())
    known = set(monitor.req_content)
    if known != set(requests):
        problems.append(f"requests tracked {sorted(map(str, known))} differ from the state's "
                        f"{sorted(map(str, requests))}")
        requests = [r for r in requests if r in known]
    whole: list[RequestId] = []
    lengths: list[int] = []
    spans: list[tuple[RequestId, int, int]] = []
    for request_id in requests:
        record = state.requests[request_id]
        tokens = monitor.req_content[request_id]
        if len(tokens) != record.allocated:
            problems.append(f"request {request_id!r} maps {record.allocated} tokens, monitor knows "
                            f"{len(tokens)}")
        length = min(record.allocated, len(tokens))
        if record.dangling:
            spans.extend(_live_spans(request_id, length, record.dangling, monitor.size))
        else:
            whole.append(request_id)
            lengths.append(length)
    contents = [c for r, n in zip(whole, lengths, strict=True) for c in monitor.req_content[r][:n]]
    layers = ex.layer_num
    checked = 0
    if contents:
        for name, slots in export_slots(ex, state, whole, lengths, monitor.request_pool).items():
            checked += len(contents) * layers
            bad = layout.mismatches(slots, contents)
            if len(bad):
                row = int(bad[0])
                request_id, position = locate(row, whole, lengths)
                layer = layout.first_bad_layer(int(slots[row]), contents[row])
                problems.append(f"{name} layer {layer}: request {request_id!r} position {position} "
                                f"reads another token's tag ({len(bad)} bad reads)")
        problems.extend(gather_problems(ex, layout, state, whole, lengths, contents))
        checked += len(contents) * layers
    checked += _span_reads(monitor, state, spans, problems)
    checked += _tree_reads(monitor, state, problems)
    checked += verify_host(monitor, state, problems)
    if monitor.swa is not None:
        checked += verify_swa(monitor.swa, state, problems)
    monitor.clear_dirty()
    monitor.reported = len(monitor.errors)
    return IntegrityReport(not problems, tuple(problems), checked)


def _live_spans(request_id: RequestId, length: int, dangling: Any, size: int
                ) -> list[tuple[RequestId, int, int]]:
    """Position spans of a request's table that are not dangling."""
    spans, start = [], 0
    for index in sorted(dangling):
        stop = min(index * size, length)
        if stop > start:
            spans.append((request_id, start, stop))
        start = max(start, index * size + size)
    if length > start:
        spans.append((request_id, start, length))
    return spans


def _span_reads(monitor: Any, state: Any, spans: list[tuple[RequestId, int, int]],
                problems: list[str]) -> int:
    """Live positions of requests with dangling entries, through ``vllm_slot_mapping`` and an
    attached ``ReqToTokenPool``'s own table (the whole-row exports refuse those requests)."""
    from kvstate.executor.exports import vllm_slot_mapping

    if not spans:
        return 0
    contents = [c for r, a, b in spans for c in monitor.req_content[r][a:b]]
    reads = {"vllm_slot_mapping": vllm_slot_mapping(state, spans).tolist()}
    pool = monitor.request_pool
    if pool is not None and all(isinstance(r, int) for r, _, _ in spans):
        reads["ReqToTokenPool.req_to_token"] = [int(s) for r, a, b in spans
                                                for s in pool.req_to_token[r, a:b].tolist()]
    for name, slots in reads.items():
        bad = monitor.layout.mismatches(slots, contents)
        if len(bad):
            span, offset = locate(int(bad[0]), list(range(len(spans))),
                                  [b - a for _, a, b in spans])
            request_id, start, _ = spans[int(span)]
            problems.append(f"{name}: request {request_id!r} position {start + offset} reads "
                            f"another token's tag ({len(bad)} bad reads)")
    return len(contents) * monitor.executor.layer_num * len(reads)


def _tree_reads(monitor: Any, state: Any, problems: list[str]) -> int:
    size = state.geometry.page_size
    if state.geometry.mode == "block":
        slots, contents = block_tree_reads(monitor, state, problems)
    else:
        slots, contents = [], []
        for node_id in state.nodes.keys():
            if node_id == ROOT:
                continue
            node_slots = expand_pages(state.nodes[node_id].pages, size)
            record: list[Content] | None = monitor.node_content.get(node_id)
            if record is None or len(record) != len(node_slots):
                problems.append(f"tree node {node_id} has no matching tag record")
                continue
            slots.extend(node_slots)
            contents.extend(record)
    if not contents:
        return 0
    bad = monitor.layout.mismatches(slots, contents)
    if len(bad):
        layer = monitor.layout.first_bad_layer(slots[int(bad[0])], contents[int(bad[0])])
        problems.append(f"layer {layer}: a tree token does not read back its tag "
                        f"(slot {slots[int(bad[0])]}, {len(bad)} bad reads)")
    return len(contents) * monitor.executor.layer_num
