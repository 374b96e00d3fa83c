"""Regenerate the committed ``replay/`` corpus and the bundled demo log.

    python tools/make_replay_corpus.py [--out DIR] [--force]

Writes every log that is not there yet with its ``.expect.json`` sidecar
(the expected exit code, event and request counts, final fingerprint and,
for failing logs, the failure).  Logs already committed are golden: they
were written by a released format version and are never rewritten when the
format moves on (docs/log-format.md), so they are left alone unless
``--force`` (then every log is rewritten in the current format; never for a
release).  The demo log is copied to ``kvstate/data/demo.kvlog`` so
``kvstate replay`` works from an installed package.  Output is
deterministic: running it twice gives identical bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import replace as evolve_event

from kvstate.events import Split, encode_event
from kvstate.events.codec import CODEC
from kvstate.log import LogReader, Recorder, write_log
from kvstate.log.format import BLOCK_PREFIX, FRAME, LENGTH, MAGIC, PREAMBLE_SIZE, frame
from kvstate.replay import replay_path
from kvstate.workloads.corpus import (
    double_free,
    seed_000_radix_example,
    seed_001_prefix_hit,
    tiered_offload_and_load,
    vllm_prefix_caching,
)
from kvstate.workloads.synthetic import SyntheticRun, WorkloadSpec, run_synthetic

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "replay"
DEMO = "synthetic/demo_sglang_p4.kvlog"
SYNTHETIC = {
    "synthetic/demo_sglang_p4.kvlog": WorkloadSpec(requests=24, seed=3, page_size=4, capacity=512,
                                                   max_running=4),
    "synthetic/sglang_p1_s7.kvlog": WorkloadSpec(requests=40, seed=7, page_size=1, capacity=512),
    "synthetic/sglang_p4_s11_tight.kvlog": WorkloadSpec(requests=120, seed=11, page_size=4,
                                                        capacity=448, max_running=6),
    "synthetic/sglang_p16_s5.kvlog": WorkloadSpec(requests=60, seed=5, page_size=16, capacity=1024,
                                                  system_len=(32, 96)),
}


def _record_synthetic(path: Path, spec: WorkloadSpec) -> None:
    meta = {"workload": "synthetic", "requests": spec.requests, "seed": spec.seed,
            "page_size": spec.page_size, "capacity": spec.capacity, "front_end": "kvstate.sglang"}
    holder: dict[str, Recorder] = {}

    def attach(run: SyntheticRun) -> None:
        holder["recorder"] = Recorder(run.engine, path, checkpoint_every=256, meta=meta, fsync=False)

    run_synthetic(spec, attach=attach)
    holder["recorder"].close()


def _frame_offsets(data: bytes | bytearray) -> list[int]:
    """The offset of every record frame after the header frame."""
    offsets = []
    length, _ = FRAME.unpack_from(data, PREAMBLE_SIZE)
    offset = PREAMBLE_SIZE + FRAME.size + length
    while offset < len(data):
        offsets.append(offset)
        length, _ = FRAME.unpack_from(data, offset)
        offset += FRAME.size + length
    return offsets


def _truncate_mid_record(source: Path, target: Path) -> int:
    """Copy ``source`` cut in the middle of its 10th record (or of the one before its end
    record, in a shorter log); returns that record's offset."""
    data = source.read_bytes()
    offsets = _frame_offsets(data)
    offset = offsets[min(9, len(offsets) - 2)]
    length, _ = FRAME.unpack_from(data, offset)
    target.write_bytes(data[: offset + FRAME.size + length // 2])
    return offset


def _flip_bit(source: Path, target: Path) -> int:
    """Copy ``source`` with one bit flipped inside the body of its 5th record (or of the one
    before its end record, in a shorter log); returns its offset."""
    data = bytearray(source.read_bytes())
    offsets = _frame_offsets(data)
    offset = offsets[min(4, len(offsets) - 2)]
    data[offset + FRAME.size + 1] ^= 0x04
    target.write_bytes(bytes(data))
    return offset


def _corrupt_checkpoint(source: Path, target: Path) -> None:
    """Copy ``source`` with the first checkpoint's fingerprint changed and its CRC recomputed."""
    import zlib

    data = bytearray(source.read_bytes())
    offset = PREAMBLE_SIZE
    length, _ = FRAME.unpack_from(data, offset)
    offset += FRAME.size + length
    while True:
        length, _ = FRAME.unpack_from(data, offset)
        body = data[offset + FRAME.size: offset + FRAME.size + length]
        if body[1:4] == b"\xa2#c":
            body[-1] ^= 0xFF
            crc = zlib.crc32(bytes(body), zlib.crc32(LENGTH.pack(length)))
            data[offset: offset + FRAME.size + length] = FRAME.pack(length, crc) + body
            break
        offset += FRAME.size + length
    target.write_bytes(bytes(data))


def _edit_split_time(source: Path, target: Path) -> int:
    """Copy ``source`` with its first ``Split`` stamped one tick earlier, CRC recomputed.

    A later ``Touch`` overwrites the stamp, so every checkpoint's fingerprint still
    matches; only the digest of the checkpoint interval holding the edit breaks.
    Returns the edited record's offset.
    """
    data = source.read_bytes()
    with LogReader(source) as reader:
        located = list(reader.records())
    offset, split = next((o, item) for o, item in located if isinstance(item, Split))
    length, _ = FRAME.unpack_from(data, offset)
    stamped = evolve_event(split, time=split.time - 1)
    if data[offset + FRAME.size: offset + FRAME.size + 5] == BLOCK_PREFIX:  # format 3
        block = [stamped if item is split else item for o, item in located if o == offset]
        edited = bytearray(BLOCK_PREFIX)
        CODEC.encode_plain_list(block, edited)
    else:
        edited = bytearray(encode_event(stamped))
    assert len(edited) == length
    target.write_bytes(data[:offset] + frame(bytes(edited)) + data[offset + FRAME.size + length:])
    return offset


def _expect(path: Path, description: str, **extra: Any) -> dict[str, Any]:
    result = replay_path(str(path), check_every=1)
    out: dict[str, Any] = {"description": description, "exit": 0 if result.ok else
                           (2 if result.failure and result.failure.kind == "format" else 1),
                           "events": result.summary.events, "requests": result.summary.requests,
                           "final_fingerprint": result.summary.final_fingerprint}
    if result.failure is not None:
        failure = result.failure.to_json()
        failure.pop("event", None)
        out["error"] = failure
    out.update(extra)
    return out


def build(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Write every corpus log under ``out_dir``; returns name -> expectation."""
    expectations: dict[str, dict[str, Any]] = {}
    for sub in ("seed", "synthetic", "failing", "malformed", "findings", "vllm", "tiered",
                "format2", "format3"):
        (out_dir / sub).mkdir(parents=True, exist_ok=True)

    def add(name: str, description: str, make: Callable[[Path], None], **extra: Any) -> Path:
        path = out_dir / name
        make(path)
        expectations[name] = _expect(path, description, **extra)
        return path

    geometry, events = seed_000_radix_example()
    add("seed/000_radix_example.kvlog", "seed 000: radix insert, split on a partial match, lock, "
        "evict unlocked leaves, unlock, LRU evict",
        lambda p: write_log(p, geometry, events, checkpoint_every=4, meta={"scenario": "seed 000"}))
    geometry1, events1 = seed_001_prefix_hit()
    seed1 = add("seed/001_prefix_hit_walkthrough.kvlog", "seed 001: req_0 (row 1) hits prefix slots "
                "[42, 17, 88], takes new slots [5, 9], finishes and caches its prompt",
                lambda p: write_log(p, geometry1, events1, checkpoint_every=4,
                                    meta={"scenario": "seed 001"}))
    for name, spec in SYNTHETIC.items():
        add(name, f"synthetic SGLang workload: {spec.requests} requests, seed {spec.seed}, page size "
            f"{spec.page_size}, {spec.capacity} tokens of KV, up to {spec.max_running} running",
            lambda p, spec=spec: _record_synthetic(p, spec))
    vllm_geometry, vllm_events = vllm_prefix_caching()
    add("vllm/prefix_caching_b4.kvlog", "vLLM front end (block mode): six requests on two shared "
        "stems, hits, lazy eviction of cached free blocks, reset_prefix_cache",
        lambda p: write_log(p, vllm_geometry, vllm_events, checkpoint_every=16,
                            meta={"scenario": "vllm prefix caching"}))
    for policy in ("write_through", "write_back"):
        tier_geometry, host_pages, tier_events = tiered_offload_and_load(policy)
        add(f"tiered/{policy}_hit.kvlog", f"host tier ({policy}): a cached prompt is evicted to "
            "the host and loaded back by the next hit",
            lambda p, g=tier_geometry, h=host_pages, e=tier_events, w=policy: write_log(
                p, g, e, checkpoint_every=4, host_pages=h, meta={"scenario": f"tiered {w}"}))
    bad = double_free(events1, geometry1)
    add("failing/double_free.kvlog", "seed 001 followed by a Free of a page that is already free: "
        "the rules refuse the last event",
        lambda p: _append_unchecked(p, geometry1, bad))
    seed0_v2 = add("format2/000_radix_example.kvlog", "seed 000 written in format 2 (digests in "
                   "every checkpoint and the end record)",
                   lambda p: write_log(p, geometry, events, checkpoint_every=4,
                                       meta={"scenario": "seed 000"}))
    add("format2/001_prefix_hit_walkthrough.kvlog", "seed 001 written in format 2",
        lambda p: write_log(p, geometry1, events1, checkpoint_every=4, meta={"scenario": "seed 001"}))
    add("format3/000_radix_example.kvlog", "seed 000 written in format 3 (event blocks between "
        "the checkpoints)", lambda p: write_log(p, geometry, events, checkpoint_every=4,
                                                 meta={"scenario": "seed 000"}))
    add("format3/001_prefix_hit_walkthrough.kvlog", "seed 001 written in format 3",
        lambda p: write_log(p, geometry1, events1, checkpoint_every=4, meta={"scenario": "seed 001"}))
    add("failing/edited_split_time.kvlog", "format 2 seed 000 with its first Split stamped a tick "
        "earlier and the CRC recomputed; a later Touch overwrites the stamp, so every fingerprint "
        "matches, but the digest of the second checkpoint interval breaks",
        lambda p: None if _edit_split_time(seed0_v2, p) < 0 else None)
    add("failing/bad_checkpoint.kvlog", "the seed 001 log with its first checkpoint's fingerprint "
        "altered (CRC recomputed): a fingerprint mismatch", lambda p: _corrupt_checkpoint(seed1, p))
    from specs.findings import FINDINGS, POOLS, RESULT_FINDINGS

    for finding, (finding_geometry, finding_events) in sorted(FINDINGS.items()):
        pools = POOLS.get(finding, {})
        add(f"findings/{finding}.kvlog", f"spec finding {finding}: the core once accepted the last "
            "event; now the rules refuse it (specs/SPEC.md, Findings)",
            lambda p, g=finding_geometry, e=finding_events, k=pools: _append_unchecked(p, g, e, k))
    for finding, (finding_geometry, finding_events) in sorted(RESULT_FINDINGS.items()):
        add(f"findings/{finding}.kvlog", f"spec finding {finding}: a legal last event once left a "
            "state the spec disagrees with; now it replays clean (specs/SPEC.md, Findings)",
            lambda p, g=finding_geometry, e=finding_events: write_log(p, g, e))
    demo = out_dir / DEMO
    add("malformed/torn_tail.kvlog", "the demo log cut in the middle of its 10th record (a crash "
        "while writing)", lambda p: None if _truncate_mid_record(demo, p) < 0 else None)
    add("malformed/bit_flip.kvlog", "the demo log with one bit flipped in its 5th record",
        lambda p: None if _flip_bit(demo, p) < 0 else None)
    return expectations


def _append_unchecked(path: Path, geometry: Any, events: list[Any],
                      pools: dict[str, int] | None = None) -> None:
    """Rewrite ``path`` with ``events`` written verbatim (the last one is invalid);
    ``pools``: the ``initial_state`` pool sizes (``swa_pages``, ``mamba_slots``)."""
    from kvstate import apply_all
    from kvstate.log import LogWriter, make_header
    from kvstate.state import initial_state

    pools = pools or {}
    writer = LogWriter(path, make_header(geometry, checkpoint_every=0, meta={"scenario": "failing"},
                                         **pools), fsync=False)
    writer.write_events(events)
    state = apply_all(initial_state(geometry, **pools), events[:-1])
    writer.close(state.fingerprint())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPLAY)
    parser.add_argument("--force", action="store_true",
                        help="rewrite the golden logs too, in the current format")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        expectations = build(fresh)
        for name, expectation in expectations.items():
            target = args.out / name
            if target.exists() and not args.force:
                continue  # golden: written by an earlier format, kept byte for byte
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh / name, target)
            sidecar = args.out / (name + ".expect.json")
            sidecar.write_text(json.dumps(expectation, indent=2, sort_keys=True) + "\n",
                               encoding="utf-8")
            print(f"{name}: exit {expectation['exit']}, {expectation['events']} events")
    demo = (args.out / DEMO).read_bytes()
    assert demo.startswith(MAGIC)
    (ROOT / "kvstate" / "data" / "demo.kvlog").write_bytes(demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
