"""Differential probe: vLLM 0.33's block hashes and KV-event bytes versus kvstate's.

Two halves, run with two interpreters (not a CI dependency):

1. With the peer venv that has vLLM 0.33 installed (see ../shared/peers/setup_peers.sh)::

       $PEERS/venv-vllm/bin/python tools/vllm_wire_probe.py --emit > probe.json

   drives vLLM's own ``init_none_hash``, ``Request`` + ``get_request_block_hasher``,
   ``to_event_extra_keys`` and the msgspec encoder of ``vllm.distributed.kv_events``
   over the fixed cases below and prints what they produced as JSON.

2. With kvstate's interpreter::

       python tools/vllm_wire_probe.py --check probe.json

   recomputes every case with ``kvstate.vllm`` and reports each mismatch
   (exit status 1 if any).  The values the tests pin were taken from step 1.

Transport: ``--zmq-serve PORT`` (peer venv) runs vLLM's ``ZmqEventPublisher`` on
loopback ports PORT and PORT+1 and publishes before anyone subscribes;
``--zmq-check PORT`` (kvstate) then subscribes late with ``start_seq=0`` and must
recover the early batches through vLLM's replay socket, in order.
``--zmq-publish PORT`` (kvstate) and ``--zmq-consume PORT`` (peer venv) are the
reverse: vLLM's msgspec types decode kvstate's live and replayed payloads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# (name, hash_seed or None, block_size, token_ids, lora (name, path) or None,
#  cache_salt or None, mm spans [(identifier, offset, length)], appended output tokens)
HASH_CASES: list[tuple[str, str | None, int, list[int], Any, Any, list[Any], list[int]]] = [
    ("plain_seed0", "0", 4, list(range(1, 11)), None, None, [], []),
    ("plain_default_seed", None, 4, list(range(1, 11)), None, None, [], []),
    (
        "seed42_bs16_big_tokens",
        "42",
        16,
        [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 151_935, 7, 8, 9, 10, 11, 12, 100_000, 1, 2],
        None,
        None,
        [],
        [],
    ),
    ("lora_and_salt", None, 4, list(range(12)), ("adapter-x", "/adapters/x"), "tenant-1", [], []),
    ("lora_only_same", None, 4, list(range(8)), ("same", "/p"), None, [], []),
    ("salt_only_same", None, 4, list(range(8)), None, "same", [], []),
    (
        "multimodal",
        "0",
        4,
        list(range(100, 120)),
        None,
        None,
        [("img-a", 2, 5), ("img-b", 9, 3), ("img-c", 13, 6)],
        [],
    ),
    ("appended_outputs", "7", 4, [5, 6, 7, 8, 9], None, "s", [("m", 1, 2)], [10, 11, 12, 13, 14]),
]

# Cases also run with vLLM's default ``sha256`` (pickle) algorithm.
PICKLE_CASES = ("plain_seed0", "plain_default_seed", "lora_and_salt", "multimodal")


def _batch_cases(kv: Any) -> list[tuple[str, Any]]:
    """Event batches built from a module exposing vLLM's event class names."""
    return [
        (
            "reference_2_4",
            kv.KVEventBatch(
                ts=1700000000.0,
                events=[
                    kv.BlockStored(
                        block_hashes=[2164874634404590027, 17270480062156288726],
                        parent_block_hash=None,
                        token_ids=list(range(1, 9)),
                        block_size=4,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        extra_keys=None,
                        group_idx=0,
                        kv_cache_spec_kind="full_attention",
                        kv_cache_spec_sliding_window=None,
                    ),
                    kv.BlockRemoved(block_hashes=[17270480062156288726], medium="GPU", group_idx=0),
                    kv.AllBlocksCleared(),
                ],
                data_parallel_rank=0,
            ),
        ),
        (
            "all_fields",
            kv.KVEventBatch(
                ts=12.25,
                events=[
                    kv.BlockStored(
                        block_hashes=[b"\x01" * 32, 5],
                        parent_block_hash=2**63 + 5,
                        token_ids=[0, 1, 300, 70000, 2**33],
                        block_size=2,
                        lora_id=3,
                        medium="CPU",
                        lora_name="adapter-x",
                        extra_keys=[("adapter-x", ("img", -3), "salt"), None],
                        group_idx=1,
                        kv_cache_spec_kind="sliding_window",
                        kv_cache_spec_sliding_window=128,
                        locality="LOCAL",
                        ownership="tier2",
                        session_id="sess",
                        lookahead_token_ids=[[1, 2], [3]],
                    ),
                    kv.BlockRemoved(
                        block_hashes=[b"\xff" * 16],
                        medium=None,
                        group_idx=2,
                        locality="REMOTE",
                        ownership="o",
                    ),
                ],
                data_parallel_rank=None,
            ),
        ),
        (
            "extra_keys_all_none",
            kv.KVEventBatch(
                ts=0.5,
                events=[
                    kv.BlockStored(
                        block_hashes=[1, 2],
                        parent_block_hash=9,
                        token_ids=[1, 2, 3, 4],
                        block_size=2,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        extra_keys=[None, None],
                    )
                ],
                data_parallel_rank=3,
            ),
        ),
        ("empty", kv.KVEventBatch(ts=1.0, events=[], data_parallel_rank=None)),
    ]


def emit() -> dict[str, Any]:
    """Run vLLM 0.33 itself over every case (peer venv only)."""
    import msgspec
    from vllm.distributed import kv_events as vkv
    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core import kv_cache_utils as kcu

    result: dict[str, Any] = {"vllm_version": __import__("vllm").__version__}
    none_hashes = {}
    for seed in (None, "0", "42", ""):
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        kcu.init_none_hash(sha256_cbor)
        none_hashes[repr(seed)] = kcu.NONE_HASH.hex()
    result["none_hash"] = none_hashes

    for result_key, hash_fn in (("hashes", sha256_cbor), ("hashes_sha256", sha256)):
        result[result_key] = _emit_hashes(hash_fn, result_key == "hashes")
    result["batches_map"] = {name: msgspec.msgpack.encode(batch).hex() for name, batch in _batch_cases(vkv)}
    decoder = msgspec.msgpack.Decoder(type=vkv.KVEventBatch)
    try:
        decoder.decode(bytes.fromhex("93cb3ff00000000000009191b0416c6c426c6f636b73436c6561726564c0"))
        result["array_form_rejected"] = False
    except msgspec.DecodeError as error:
        result["array_form_rejected"] = str(error)
    return result


def _emit_hashes(hash_fn: Any, all_cases: bool) -> dict[str, Any]:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.request import Request

    hashes = {}
    for name, seed, block_size, tokens, lora, salt, mm, appended in HASH_CASES:
        if not all_cases and name not in PICKLE_CASES:
            continue
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        kcu.init_none_hash(hash_fn)
        features = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=ident,
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
            for ident, offset, length in mm
        ]
        request = Request(
            request_id=name,
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=64),
            pooling_params=None,
            mm_features=features or None,
            lora_request=LoRARequest(lora[0], 1, lora[1]) if lora else None,
            cache_salt=salt,
            block_hasher=kcu.get_request_block_hasher(block_size, hash_fn),
        )
        if appended:
            request.append_output_token_ids(list(appended))
        total = len(tokens) + len(appended)
        all_tokens = list(tokens) + list(appended)
        tagged = []
        for index in range(total // block_size):
            keys, _ = kcu.generate_block_hash_extra_keys(
                request, index * block_size, (index + 1) * block_size, 0
            )
            tagged.append(keys)
        hashes[name] = {
            "block_hashes": [h.hex() for h in request.block_hashes],
            "external": [kcu.maybe_convert_block_hash(h) for h in request.block_hashes],
            "tagged_extra_keys": repr(tagged),
            "event_extra_keys": repr(kcu.to_event_extra_keys(tagged)),
            "num_tokens": len(all_tokens),
        }
    return hashes


def check(reference: dict[str, Any]) -> list[str]:
    """Recompute every case with kvstate and list the differences."""
    from kvstate.vllm import kv_events as kkv
    from kvstate.vllm.hashing import (
        MultiModalSpan,
        block_extra_keys,
        external_block_hash,
        none_hash,
        request_block_hashes,
        to_event_extra_keys,
    )

    problems: list[str] = []
    for seed_repr, expected in reference["none_hash"].items():
        seed = None if seed_repr == "None" else seed_repr.strip("'")
        if none_hash(seed).hex() != expected:
            problems.append(f"none_hash({seed_repr})")
    for algo, name, seed, block_size, tokens, lora, salt, mm, appended in [
        (algo, *case)
        for algo, result_key in (("sha256_cbor", "hashes"), ("sha256", "hashes_sha256"))
        for case in HASH_CASES
        if case[0] in reference[result_key]
    ]:
        expected = reference["hashes" if algo == "sha256_cbor" else "hashes_sha256"][name]
        spans = [MultiModalSpan(ident, offset, length) for ident, offset, length in mm]
        options: dict[str, Any] = {
            "lora_name": lora[0] if lora else None,
            "lora_path": lora[1] if lora else "",
            "mm_spans": spans,
            "cache_salt": salt,
        }
        options["hash_algo"] = algo
        prompt_hashes = request_block_hashes(tokens, block_size, hash_seed=seed, **options)
        all_tokens = list(tokens) + list(appended)
        ours = prompt_hashes + request_block_hashes(
            all_tokens, block_size, hash_seed=seed, known_hashes=prompt_hashes, **options
        )
        del options["hash_algo"]
        if [h.hex() for h in ours] != expected["block_hashes"]:
            problems.append(f"{algo} {name}: block hashes differ")
        if [external_block_hash(h) for h in ours] != expected["external"]:
            problems.append(f"{name}: external hashes differ")
        tagged = [
            block_extra_keys(i * block_size, (i + 1) * block_size, **options)
            for i in range(len(all_tokens) // block_size)
        ]
        if repr(tagged) != expected["tagged_extra_keys"]:
            problems.append(f"{name}: tagged extra keys {tagged!r}")
        if repr(to_event_extra_keys(tagged)) != expected["event_extra_keys"]:
            problems.append(f"{name}: event extra keys {to_event_extra_keys(tagged)!r}")
    for name, batch in _batch_cases(kkv):
        encoded = kkv.encode_event_batch(batch, format="map").hex()
        if encoded != reference["batches_map"][name]:
            problems.append(f"batch {name}: ours {encoded} vLLM {reference['batches_map'][name]}")
        if kkv.decode_event_batch(bytes.fromhex(reference["batches_map"][name])) != batch:
            problems.append(f"batch {name}: decoding vLLM's bytes does not round-trip")
    return problems


def zmq_serve(port: int, count: int, linger_s: float) -> None:
    """Peer venv: vLLM's own ZmqEventPublisher on loopback, publishing ``count`` batches."""
    import time

    from vllm.distributed import kv_events as vkv

    publisher = vkv.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{port}",
        replay_endpoint=f"tcp://*:{port + 1}",
        topic="kv-events",
    )
    for index in range(count):
        publisher.publish(
            vkv.KVEventBatch(ts=float(index), events=[vkv.BlockRemoved(block_hashes=[index], medium="GPU")])
        )
    deadline = time.monotonic() + linger_s
    index = count
    while time.monotonic() < deadline:  # keep publishing so a late subscriber sees live traffic
        publisher.publish(
            vkv.KVEventBatch(ts=float(index), events=[vkv.BlockRemoved(block_hashes=[index], medium="GPU")])
        )
        index += 1
        time.sleep(0.05)
    publisher.shutdown()


def zmq_check(port: int, count: int) -> list[str]:
    """kvstate side: subscribe late to vLLM's publisher and catch up through its replay socket."""
    import time

    from kvstate.vllm.kv_events import BlockRemoved
    from kvstate.vllm.zmq_events import KVEventSubscriber

    subscriber = KVEventSubscriber(
        f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}", topic="kv-events", start_seq=0
    )
    received = []
    deadline = time.monotonic() + 20
    while len(received) < count + 5 and time.monotonic() < deadline:
        received.extend(subscriber.receive(timeout_s=0.5))
    subscriber.close()
    problems = []
    if [item.seq for item in received] != list(range(len(received))) or len(received) < count + 5:
        problems.append(f"sequence {[item.seq for item in received][:20]}...")
    for item in received:
        if item.batch.events != (BlockRemoved([item.seq], "GPU"),) or item.batch.data_parallel_rank != 0:
            problems.append(f"batch {item.seq}: {item.batch}")
    if subscriber.replay_requests < 1 or subscriber.missed:
        problems.append(f"replay_requests={subscriber.replay_requests} missed={subscriber.missed}")
    return problems


def zmq_publish(port: int, count: int, linger_s: float) -> None:
    """kvstate side: our publisher on loopback, for --zmq-consume."""
    import time

    from kvstate.vllm.kv_events import BlockRemoved, KVEventBatch
    from kvstate.vllm.zmq_events import ZmqEventPublisher

    publisher = ZmqEventPublisher(
        endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{port + 1}", topic="kv-events"
    )
    deadline = time.monotonic() + linger_s
    index = 0
    while index < count or time.monotonic() < deadline:
        publisher.publish(KVEventBatch(ts=float(index), events=[BlockRemoved([index], "GPU")]))
        index += 1
        if index >= count:
            time.sleep(0.05)
    publisher.shutdown()


def zmq_consume(port: int, count: int) -> list[str]:
    """Peer venv: decode kvstate's stream with vLLM's own msgspec types, replay over DEALER."""
    import msgspec
    import zmq
    from vllm.distributed import kv_events as vkv

    decoder = msgspec.msgpack.Decoder(type=vkv.KVEventBatch)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port + 1}")
    problems: list[str] = []
    if not sub.poll(20_000):
        return ["no live message"]
    _, seq_frame, payload = sub.recv_multipart()
    live_seq = int.from_bytes(seq_frame, "big")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    seqs = []
    while dealer.poll(5_000):
        frames = dealer.recv_multipart()
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
        seq = int.from_bytes(frames[2], "big")
        batch = decoder.decode(frames[3])
        if batch.events[0].block_hashes != [seq] or frames[1] != b"kv-events":
            problems.append(f"replayed batch {seq}: {batch}")
        seqs.append(seq)
    if seqs[: live_seq + 1] != list(range(live_seq + 1)) or live_seq < count - 1:
        problems.append(f"replayed seqs {seqs[:10]}..., live {live_seq}")
    if decoder.decode(payload).events[0].block_hashes != [live_seq]:
        problems.append("live payload")
    context.destroy(linger=0)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--emit", action="store_true", help="run vLLM (peer venv), print JSON")
    mode.add_argument("--check", metavar="JSON", help="compare kvstate against emitted JSON")
    mode.add_argument("--zmq-serve", metavar="PORT", type=int, help="run vLLM's publisher (peer venv)")
    mode.add_argument("--zmq-check", metavar="PORT", type=int, help="subscribe to it with kvstate")
    mode.add_argument("--zmq-publish", metavar="PORT", type=int, help="run kvstate's publisher")
    mode.add_argument("--zmq-consume", metavar="PORT", type=int, help="consume it with vLLM (peer venv)")
    parser.add_argument("--count", type=int, default=20, help="batches published before subscribing")
    parser.add_argument("--linger", type=float, default=15.0, help="seconds --zmq-serve keeps publishing")
    args = parser.parse_args(argv)
    if args.zmq_serve is not None:
        zmq_serve(args.zmq_serve, args.count, args.linger)
        return 0
    if args.zmq_publish is not None:
        zmq_publish(args.zmq_publish, args.count, args.linger)
        return 0
    if args.zmq_consume is not None:
        problems = zmq_consume(args.zmq_consume, args.count)
        for problem in problems:
            print("MISMATCH", problem)
        print(f"{'FAIL' if problems else 'OK'}: vLLM's decoder and DEALER replay against kvstate's publisher")
        return 1 if problems else 0
    if args.zmq_check is not None:
        problems = zmq_check(args.zmq_check, args.count)
        for problem in problems:
            print("MISMATCH", problem)
        print(f"{'FAIL' if problems else 'OK'}: kvstate subscriber against vLLM's ZmqEventPublisher")
        return 1 if problems else 0
    if args.emit:
        json.dump(emit(), sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    with open(args.check, encoding="utf-8") as handle:
        reference = json.load(handle)
    problems = check(reference)
    for problem in problems:
        print("MISMATCH", problem)
    print(f"{'FAIL' if problems else 'OK'}: checked against vLLM {reference['vllm_version']}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
