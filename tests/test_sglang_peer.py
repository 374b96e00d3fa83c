"""tools/peer_kvstate_sglang.py drives kvstate through the public SGLang calls, in the peer harness's
step order (decode, admission, outputs, finish), and leaves a clean state behind."""

import importlib.util
import random
from pathlib import Path

import pytest

from kvstate import check
from kvstate.events import FreeMapped, Scatter

TOOL = Path(__file__).resolve().parent.parent / "tools" / "peer_kvstate_sglang.py"


def load_peer():
    spec = importlib.util.spec_from_file_location("peer_kvstate_sglang", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Request:
    def __init__(self, rid, prompt, outputs):
        self.rid, self.prompt, self.outputs = rid, prompt, outputs


def run(peer, requests):
    """The harness's loop, minus its timing and capacity rule (the pool is large enough)."""
    waiting, running = list(requests), []
    while waiting or running:
        if running:
            peer.decode_alloc([h for h, _, _ in running])
        new = []
        while waiting and len(new) < 3 and len(running) + len(new) < 8:
            r = waiting.pop(0)
            handle = peer.create(r)
            peer.match(handle)
            assert peer.admit(handle)
            new.append([handle, r, 0])
        peer.flush_admissions()
        for entry in running:
            peer.append(entry[0], entry[1].outputs[entry[2]])
            entry[2] += 1
        for entry in new:
            peer.append_first(entry[0], entry[1].outputs[0], len(entry[1].outputs) == 1)
            entry[2] = 1
        still = []
        for entry in running + new:
            handle, r, emitted = entry
            if emitted >= len(r.outputs):
                peer.finish(handle, len(r.prompt) + len(r.outputs) - 1)
            else:
                still.append(entry)
        running = still


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_adapter_runs_a_workload_and_records_it(page_size, tmp_path, monkeypatch):
    log = tmp_path / "peer.kvlog"
    monkeypatch.setenv("KVSTATE_RECORD", str(log))
    rng = random.Random(page_size)
    system = [rng.randrange(1, 50) for _ in range(10)]
    requests = [Request(i, system + [rng.randrange(1, 50) for _ in range(rng.randint(1, 9))],
                        [rng.randrange(1, 50) for _ in range(rng.randint(1, 6))]) for i in range(12)]
    peer = load_peer().Peer(capacity_tokens=512, page_size=page_size, max_running=8, max_context=64)
    kinds = set()
    peer.r2t.engine.subscribe(lambda event, view: kinds.add(type(event)))
    run(peer, requests)
    assert peer.avail_tokens() == 512 and peer.used_tokens() == 0
    assert check(peer.tree.state) == [] and peer.r2t.verify() == []
    assert peer.tree.evictable_size() > 0 and peer.r2t.available_size() == 8
    assert Scatter in kinds and (FreeMapped in kinds) == (page_size > 1)
    peer.recorder.close()
    assert log.stat().st_size > 0
