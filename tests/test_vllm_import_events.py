"""``kvstate import-events``: captured vLLM / SGLang event streams -> a checked prefix-index log."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from kvstate.cli import main
from kvstate.log import replay_path
from kvstate.vllm.importer import BlockIndexImporter, read_capture
from kvstate.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    encode_event_batch,
)
from kvstate.vllm.manager import KVCacheManager
from kvstate.vllm.request import Request

BS = 4


def captured_batches() -> list[KVEventBatch]:
    """A vLLM-front-end run with duplicate copies (a prompt-logprobs request) and evictions."""
    manager = KVCacheManager(8, BS, 64, enable_kv_cache_events=True)
    batches = []

    def step() -> None:
        events = manager.take_events()
        if events:
            batches.append(KVEventBatch(float(len(batches)), events, 0))

    first = Request("a", list(range(9)), BS)
    blocks, hit, _ = manager.get_computed_blocks(first)
    manager.allocate_slots(first, first.num_tokens - hit, hit, blocks)
    step()
    dup = Request("b", list(range(9)), BS, skip_reading_prefix_cache=True)
    manager.allocate_slots(dup, dup.num_tokens)
    step()
    manager.free(first)
    manager.free(dup)
    other = Request("c", list(range(100, 117)), BS)
    manager.allocate_slots(other, other.num_tokens)  # evicts copies of the first chain
    step()
    manager.free(other)
    assert manager.reset_prefix_cache()
    step()
    return batches


def write_capture(path: Path, batches: list[KVEventBatch], wire_format: str = "map") -> None:
    path.write_bytes(b"".join(encode_event_batch(b, format=wire_format) for b in batches))


def test_import_counts_copies_and_replays(tmp_path: Path) -> None:
    batches = captured_batches()
    importer = BlockIndexImporter(batches)
    importer.run()
    stats = importer.stats
    assert (stats.stored_blocks, stats.duplicate_copies, stats.clears) == (8, 2, 1)
    assert stats.removed_blocks == 2 and stats.removed_with_copies_left == 2
    assert stats.unknown_removals == 0 and stats.peak_copies == 6
    assert len(importer.engine.state.nodes) == 1  # cleared at the end
    capture = tmp_path / "events.msgpack"
    write_capture(capture, batches)
    log = tmp_path / "index.kvlog"
    assert main(["import-events", str(capture), "-o", str(log)]) == 0
    result = replay_path(str(log))
    assert result.ok, result.failure
    assert result.header.geometry.mode == "block"


def test_a_hash_stays_indexed_until_its_last_copy_goes() -> None:
    stored = BlockStored([11], None, [1, 2, 3, 4], BS, None, "GPU", None)
    batches = [KVEventBatch(0.0, [stored, stored, BlockRemoved([11], "GPU")], None)]
    importer = BlockIndexImporter(batches)
    state = importer.run().state
    [node] = [n for node_id, n in state.nodes.items() if node_id != 0]
    assert len(node.pages) == 1
    assert importer.stats.removed_with_copies_left == 1


def test_sglang_array_form_with_orphan_parent(tmp_path: Path) -> None:
    events = [BlockStored([-5, 7], -3, list(range(8)), BS, None, None, None),
              BlockRemoved([7], None), BlockRemoved([99], None), AllBlocksCleared()]
    capture = tmp_path / "sglang.msgpack"
    write_capture(capture, [KVEventBatch(1.0, events, None)], wire_format="array")
    importer = BlockIndexImporter(read_capture(capture.read_bytes()))
    importer.run()
    assert importer.stats.orphan_chains == 1 and importer.stats.unknown_removals == 1
    log = tmp_path / "sglang.kvlog"
    assert main(["import-events", str(capture), "-o", str(log), "--json"]) == 0
    assert replay_path(str(log)).ok


def test_frame_lists_and_other_media(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored = BlockStored([1], None, [1, 2, 3, 4], BS, None, "GPU", None)
    offloaded = BlockStored([2], None, [5, 6, 7, 8], BS, None, "CPU", None)
    payload = encode_event_batch(KVEventBatch(0.0, [stored, offloaded], None))
    capture = tmp_path / "frames.msgpack"
    capture.write_bytes(msgpack.packb([b"kv", (0).to_bytes(8, "big"), payload]))
    log = tmp_path / "frames.kvlog"
    assert main(["import-events", str(capture), "-o", str(log), "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert (counts["stored_blocks"], counts["skipped_other_medium"]) == (1, 1)


def test_bad_captures_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KVEventDecodeError):
        read_capture(msgpack.packb({"not": "a batch"}))
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"\xc1\xc1")
    assert main(["import-events", str(bad), "-o", str(tmp_path / "x.kvlog")]) == 2
    assert main(["import-events", str(tmp_path / "missing"), "-o", str(tmp_path / "y.kvlog")]) == 2
    empty = tmp_path / "empty.msgpack"
    write_capture(empty, [KVEventBatch(0.0, [AllBlocksCleared()], None)])
    assert main(["import-events", str(empty), "-o", str(tmp_path / "z.kvlog")]) == 2
    assert "kvstate import-events" in capsys.readouterr().err


def test_import_from_a_live_endpoint_with_replay(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    import time

    pytest.importorskip("zmq")
    from kvstate.vllm.zmq_events import ZmqEventPublisher

    publisher = ZmqEventPublisher(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0",
                                  bind=True)
    batches = captured_batches()
    for batch in batches:  # published before anyone subscribes: recovered through replay
        publisher.publish(batch)
    assert publisher.wait_published(len(batches), 5.0)
    stop = threading.Event()

    def heartbeat() -> None:  # live messages until the subscriber has joined
        for _ in range(40):
            if stop.is_set():
                return
            publisher.publish(KVEventBatch(0.0, [BlockRemoved([424242], "GPU")], None))
            time.sleep(0.025)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    log = tmp_path / "live.kvlog"
    try:
        code = main(["import-events", publisher.endpoint, "--replay-endpoint",
                     str(publisher.replay_endpoint), "--start-seq", "0", "--idle-seconds", "1.5",
                     "-o", str(log), "--json"])
    finally:
        stop.set()
        thread.join()
        publisher.shutdown()
    assert code == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["stored_blocks"] == 8 and counts["clears"] == 1
    assert replay_path(str(log)).ok
