"""``kvstate import-events``: captured vLLM / SGLang event streams -> a checked prefix-index log."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kvstate.cli import main
from kvstate.replay import replay_path
from kvstate.vllm.importer import MAX_BLOCK_SIZE, BlockIndexImporter, read_capture
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


def test_published_extra_keys_key_distinct_blocks() -> None:
    """Flat keys stay readable; nested or odd ones are named by a digest (never refused)."""
    published = [[1], [["mm", 7]], [1.5], ["x" * 5000], None]
    stored = [BlockStored([index + 1], None, [1, 2, 3, 4], BS, None, "GPU", None,
                          extra_keys=[keys]) for index, keys in enumerate(published)]
    importer = BlockIndexImporter([KVEventBatch(0.0, stored, None)])
    state = importer.run().state
    extras = sorted((n.extra for node_id, n in state.nodes.items() if node_id != 0), key=repr)
    assert len(extras) == 5 and extras[0] == (("keys", 1),) and extras[-1] is None  # all distinct
    assert sum(1 for extra in extras if extra and extra[0][0] == "keys-sha256") == 3


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


# ------------------------------------------------------------------ hostile captures


def _import(argv: list[str]) -> int:
    return main(["import-events", *argv])


def test_a_capture_over_100_mib_imports_in_bounded_memory(tmp_path: Path) -> None:
    capture = tmp_path / "big.msgpack"
    stored = BlockStored([1], None, [1, 2, 3, 4], BS, None, "GPU", None)
    with capture.open("wb") as handle:
        handle.write(encode_event_batch(KVEventBatch(0.0, [stored], None)))
        for index in range(101):  # 1 MiB batches of offloaded blocks (skipped, but read)
            offloaded = BlockStored([index + 2], None, [5, 6, 7, 8], BS, None, "CPU", None,
                                    session_id="s" * 2**20)
            handle.write(encode_event_batch(KVEventBatch(1.0, [offloaded], None)))
    assert capture.stat().st_size > 100 * 2**20
    tracemalloc.start()
    try:
        code = _import([str(capture), "-o", str(tmp_path / "big.kvlog"), "--json"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB for a 101 MiB capture"
    assert replay_path(str(tmp_path / "big.kvlog")).ok


def test_a_truncated_last_batch_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batches = captured_batches()
    whole = b"".join(encode_event_batch(batch) for batch in batches)
    cut_at = len(whole) - len(encode_event_batch(batches[-1]))  # where the last batch starts
    capture = tmp_path / "cut.msgpack"
    capture.write_bytes(whole[:-3])
    log = tmp_path / "cut.kvlog"
    assert _import([str(capture), "-o", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"byte {cut_at}" in err and "ends inside an item" in err
    assert _import([str(capture), "-o", str(log), "--salvage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["salvage"]["byte_offset"] == cut_at
    assert report["salvage"]["bytes_dropped"] == len(whole) - 3 - cut_at
    assert report["batches"] == len(batches) - 1 and report["clears"] == 0
    assert replay_path(str(log)).ok
    with pytest.raises(KVEventDecodeError, match=f"byte {cut_at}"):
        read_capture(whole[:-3])


@pytest.mark.parametrize("block_size", [0, -4, 2**62, 10**7, MAX_BLOCK_SIZE + 1])
def test_declared_block_sizes_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          block_size: int) -> None:
    capture = tmp_path / "size.msgpack"
    write_capture(capture, [KVEventBatch(0.0, [BlockStored([1], None, [1, 2, 3, 4], block_size,
                                                           None, "GPU", None)], None)])
    tracemalloc.start()
    try:
        code = _import([str(capture), "-o", str(tmp_path / "size.kvlog")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB for block_size {block_size}"
    err = capsys.readouterr().err
    assert "byte 0" in err and ("outside 1..65536" in err or "only 4 token ids" in err)


def test_memory_does_not_scale_with_the_declared_block_size(tmp_path: Path) -> None:
    """A store declaring big blocks but carrying few tokens is refused, not padded."""
    capture = tmp_path / "short.msgpack"
    good = BlockStored([1], None, list(range(MAX_BLOCK_SIZE)), MAX_BLOCK_SIZE, None, "GPU", None)
    short = BlockStored(list(range(2, 2002)), 1, [1], MAX_BLOCK_SIZE, None, "GPU", None)
    write_capture(capture, [KVEventBatch(0.0, [good], None), KVEventBatch(1.0, [short], None)])
    tracemalloc.start()
    try:
        with pytest.raises(KVEventDecodeError, match="carries only 1 token ids"):
            BlockIndexImporter(read_capture(capture.read_bytes()))
        importer = BlockIndexImporter(read_capture(capture.read_bytes()), salvage=True)
        importer.run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert importer.stats.stored_blocks == 1 and importer.stopped is not None
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.1f} MiB"  # 2000 padded blocks would be ~1 GiB


def _scripted_publisher(messages: list[tuple[int, bytes]]) -> tuple[str, Any]:
    """An XPUB on loopback that sends ``messages`` once a subscriber has joined."""
    import threading

    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    pub.bind("tcp://127.0.0.1:0")
    endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()

    def serve() -> None:
        if pub.poll(5000):
            pub.recv()  # the subscription
            for seq, payload in messages:
                pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        pub.close(linger=1000)
        context.term()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return endpoint, thread


@pytest.mark.parametrize("salvage", [False, True])
def test_a_live_import_reports_drops_and_turns_a_restart_into_a_clear(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], salvage: bool) -> None:
    stored = [encode_event_batch(KVEventBatch(float(i), [BlockStored([10 + i], None, [i] * BS, BS, None,
                                                                     "GPU", None)], 0)) for i in range(4)]
    # seq 1 is junk; the engine restarts after seq 2 and numbers 0, 1 again.
    endpoint, thread = _scripted_publisher([(0, stored[0]), (1, b"\xc1junk"), (2, stored[1]),
                                            (0, stored[2]), (1, stored[3])])
    log = tmp_path / "live.kvlog"
    argv = [endpoint, "--idle-seconds", "1", "-o", str(log), "--json"]
    code = _import(argv + (["--salvage"] if salvage else []))
    thread.join(5)
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["subscriber"]["dropped"] == {"undecodable": 1}
    assert report["subscriber"]["resets"] == 1
    assert (report["stored_blocks"], report["clears"]) == (4, 1)
    assert replay_path(str(log)).ok
    if salvage:
        assert code == 0
    else:
        assert code == 2 and "1 messages were dropped or missed" in err


def test_a_hash_stored_on_two_chains_is_removed_copy_by_copy() -> None:
    """Found by the adversarial suite: hash 5 names two different token chains (a
    collision or a broken producer).  Each removal must take one of *its* copies, so
    the pool the survey sized is never exceeded by a later store."""
    events = [BlockStored([5], None, [1] * BS, BS, None, "GPU", None),
              BlockStored([5], None, [2] * BS, BS, None, "GPU", None),
              BlockRemoved([5], "GPU"), BlockRemoved([5], "GPU"),
              BlockStored([1, 2], None, [3] * (2 * BS), BS, None, "GPU", None)]
    importer = BlockIndexImporter([KVEventBatch(0.0, events, None)])
    state = importer.run().state
    assert importer.stats.peak_copies == 2 and importer.stats.unknown_removals == 0
    assert sorted(len(node.pages) for node_id, node in state.nodes.items() if node_id != 0) == [1, 1]
