"""Adversarial: hostile captures through ``CaptureReader`` and ``BlockIndexImporter``.

A capture mixes valid batches (a small vocabulary of hashes and tokens, so
copies, orphans, removals and clears interact), hostile payloads wrapped as
frame lists, and junk after the last item.  Properties:

* the reader yields exactly the batches of the items before the first bad
  one, then raises ``CaptureError`` at that item's byte offset (or ends);
* the importer, with ``salvage``, either raises ``CaptureError`` or builds an
  index that passes every core invariant (it never builds an event the core
  refuses);
* reading a capture of hostile items takes memory bounded by one item.
"""

from __future__ import annotations

import io
import random
import tracemalloc
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from kvstate.invariants import check
from kvstate.vllm.capture import CaptureError, CaptureReader
from kvstate.vllm.importer import BlockIndexImporter
from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_event_batch,
    encode_event_batch,
)
from tests.adversarial.kv_hostile import PAYLOAD_KINDS, VALID_KINDS, sized_payload
from tests.adversarial.kv_strategies import payloads

BS = 4
_hash = st.integers(0, 6)
_stored = st.builds(
    lambda hashes, parent, medium, group: BlockStored(
        hashes, parent, [h % 3 for h in hashes for _ in range(BS)], BS, None, medium, None,
        group_idx=group),
    st.lists(_hash, min_size=1, max_size=3), st.none() | _hash, st.sampled_from(["GPU", "GPU", "CPU", None]),
    st.sampled_from([None, 0, 1]))
_removed = st.builds(lambda hashes, group: BlockRemoved(hashes, "GPU", group_idx=group),
                     st.lists(_hash, max_size=3), st.sampled_from([None, 0, 1]))
_batch = st.builds(lambda events, ts: KVEventBatch(ts, events, 0),
                   st.lists(_stored | _stored | _removed | st.just(AllBlocksCleared()), max_size=4),
                   st.floats(0, 1e9))
_item = st.one_of(
    st.tuples(st.just("batch"), _batch, st.sampled_from(["map", "array"])),
    st.tuples(st.just("frames"), _batch, st.sampled_from(["map", "array"])),
    st.tuples(st.just("hostile"), payloads(), st.just("")),
)


def encode_item(kind: str, value: Any, wire_format: str) -> tuple[bytes, KVEventBatch | None]:
    """The item's bytes and the batch it must read back as (None: it must fail)."""
    if kind == "hostile":
        framed = msgpack.packb([b"", (0).to_bytes(8, "big"), value], use_bin_type=True)
        try:
            return framed, decode_event_batch(value)
        except KVEventDecodeError:
            return framed, None
    payload = encode_event_batch(value, wire_format)  # type: ignore[arg-type]
    if kind == "frames":
        return msgpack.packb([(7).to_bytes(8, "big"), payload], use_bin_type=True), value
    return payload, value


@given(st.lists(_item, max_size=12), st.binary(max_size=16))
def test_hostile_captures_read_to_the_first_bad_item(items: list[tuple[str, Any, str]], tail: bytes) -> None:
    encoded = [encode_item(*item) for item in items]
    got: list[KVEventBatch] = []
    failure: CaptureError | None = None
    try:
        got.extend(CaptureReader(io.BytesIO(b"".join(raw for raw, _ in encoded) + tail)))
    except CaptureError as error:
        failure = error
    expected, offset = [], 0
    for raw, batch in encoded:
        if batch is None:
            break
        expected.append(batch)
        offset += len(raw)
    if len(expected) < len(encoded):  # a hostile item: the reader stops exactly there
        assert failure is not None and failure.offset == offset
    elif tail:  # junk after the last item may parse as items of its own before it fails
        assert failure is None or (failure.offset is not None and failure.offset >= offset)
        got = got[: len(expected)]
    else:
        assert failure is None
    assert [encode_event_batch(b) for b in got] == [encode_event_batch(b) for b in expected]


@given(st.lists(_item, min_size=1, max_size=12), st.binary(max_size=8))
def test_any_capture_imports_to_a_valid_index_or_a_typed_error(
        items: list[tuple[str, Any, str]], tail: bytes) -> None:
    data = b"".join(encode_item(*item)[0] for item in items) + tail
    try:
        importer = BlockIndexImporter(lambda: CaptureReader(io.BytesIO(data)), salvage=True, medium=None)
    except CaptureError:
        return
    state = importer.run().state
    assert check(state) == []
    assert importer.stats.batches <= len(items) + len(tail)


def test_a_capture_reads_in_memory_bounded_by_one_item() -> None:
    """Legal but hostile-shaped items (deep unknown keys, extreme ints, big padding)."""
    rng = random.Random(99)
    kinds = sorted(VALID_KINDS)
    payloads_ = [PAYLOAD_KINDS[rng.choice(kinds)](rng) for _ in range(300)] + [sized_payload(60_000)] * 100
    rng.shuffle(payloads_)
    data = b"".join(msgpack.packb([b"", (0).to_bytes(8, "big"), p], use_bin_type=True) for p in payloads_)
    source = io.BytesIO(data)
    tracemalloc.start()
    try:
        count = sum(1 for _ in CaptureReader(source, max_item_bytes=256 * 1024))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == len(payloads_)
    assert len(data) > 5 * 2**20 and peak < 2 * 2**20, f"peak {peak / 2**20:.1f} MiB"
