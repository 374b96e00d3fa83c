"""Hypothesis state machines for KVCacheManager against a small independent model.

The model re-states seed 002's rules plus the choices in docs/kv-manager.md
with plain dicts and counters (no kvstate code): reservations and page
counts, lazy growth, prefix sharing, copy-on-write snapshots, LRU retention.
Random calls include invalid ones (unknown ids, bad layers, wrong vector
lengths, duplicates, oversize requests).  After every step the machine
checks the five stats, ``memory_efficiency``, every ``get_kv`` and the core
invariants.  Values are float32-representable, so the model's float16
rounding (``struct`` format ``e``) matches the executor's exactly.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvstate import ModelConfig, check
from kvstate.errors import OutOfMemory
from kvstate.kv_manager import KVCacheManager, ModeError, ReservationExceeded

LAYERS, WIDTH = 2, 2
CONFIG = ModelConfig(num_layers=LAYERS, num_kv_heads=1, head_dim=WIDTH)
LAYER_TOKEN_BYTES = 8  # 1 head * 2 dims * 2 bytes * (K + V)
IDS = st.sampled_from(["a", "b", "c", "d", "e"])
LAYER = st.integers(-1, LAYERS)
NUMBER = st.floats(-60000, 60000, width=32, allow_nan=False)
ZERO = ([0.0] * WIDTH, [0.0] * WIDTH)


def half(x: float) -> float:
    return float(struct.unpack("<e", struct.pack("<e", x))[0])


def vectors(draw_len: int = WIDTH) -> st.SearchStrategy[list[float]]:
    return st.lists(NUMBER, min_size=draw_len, max_size=draw_len)


VECTOR = st.one_of(vectors(), vectors(), vectors(), vectors(WIDTH + 1), vectors(WIDTH - 1))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def expect_call(call: Any, expected: Any) -> None:
    """Run ``call``; ``expected`` is an exception type or the return value."""
    if isinstance(expected, type) and issubclass(expected, BaseException):
        with pytest.raises(expected):
            call()
    else:
        assert call() == expected


class BasicMachine(RuleBasedStateMachine):
    CAPACITY = 12

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(CONFIG, self.CAPACITY * LAYERS * LAYER_TOKEN_BYTES + 5,
                                      mode="basic")
        self.reqs: dict[str, dict[str, Any]] = {}

    def reserved(self) -> int:
        return sum(r["reserved"] for r in self.reqs.values())

    @rule(rid=IDS, prompt=st.integers(-1, 7), gen=st.integers(0, 7))
    def allocate(self, rid: str, prompt: int, gen: int) -> None:
        total = prompt + gen
        if prompt < 0 or total == 0:
            expected: Any = ValueError
        elif rid in self.reqs or self.reserved() + total > self.CAPACITY:
            expected = False
        else:
            expected = True
        expect_call(lambda: self.manager.allocate(rid, prompt, gen), expected)
        if expected is True:
            self.reqs[rid] = {"reserved": total, "layers": [[] for _ in range(LAYERS)]}

    @rule(rid=IDS, layer=LAYER, key=VECTOR, value=VECTOR)
    def append(self, rid: str, layer: int, key: list[float], value: list[float]) -> None:
        req = self.reqs.get(rid)
        if req is None:
            expected: Any = KeyError
        elif not 0 <= layer < LAYERS or len(key) != WIDTH or len(value) != WIDTH:
            expected = ValueError
        elif len(req["layers"][layer]) >= req["reserved"]:
            expected = ReservationExceeded
        else:
            expected = None
        expect_call(lambda: self.manager.append_token(rid, layer, key, value), expected)
        if expected is None:
            req["layers"][layer].append(([half(x) for x in key], [half(x) for x in value]))

    @rule(data=st.data(), count=st.integers(1, 4))
    def append_valid(self, data: st.DataObject, count: int) -> None:
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        for _ in range(count):
            for layer in range(LAYERS):
                self.append(rid, layer, data.draw(vectors()), data.draw(vectors()))

    @rule(rid=IDS)
    def free(self, rid: str) -> None:
        expect_call(lambda: self.manager.free(rid), KeyError if rid not in self.reqs else None)
        self.reqs.pop(rid, None)

    @rule(rid=IDS, prompt=st.integers(0, 3))
    def paged_calls_are_refused(self, rid: str, prompt: int) -> None:
        expect_call(lambda: self.manager.allocate_paged(rid, prompt), ModeError)
        expect_call(lambda: self.manager.enable_prefix_cache(), ModeError)

    @invariant()
    def agrees_with_the_model(self) -> None:
        used = self.reserved() * LAYERS * LAYER_TOKEN_BYTES
        total = self.CAPACITY * LAYERS * LAYER_TOKEN_BYTES + 5
        assert self.manager.stats() == {
            "total_memory_bytes": total, "used_memory_bytes": used,
            "num_active_requests": len(self.reqs),
            "total_cached_tokens": sum(len(r["layers"][0]) for r in self.reqs.values()),
            "utilization_pct": used / total * 100}
        stored = sum(len(entries) for r in self.reqs.values() for entries in r["layers"])
        slots = self.reserved() * LAYERS
        assert self.manager.memory_efficiency() == (stored / slots if slots else 0.0)
        for rid, req in self.reqs.items():
            for layer in range(LAYERS):
                keys, values = self.manager.get_kv(rid, layer)
                assert list(zip(keys, values, strict=True)) == req["layers"][layer]
        assert check(self.manager.engine.state) == []


class PagedMachine(RuleBasedStateMachine):
    """Paged mode with the prefix cache on."""

    PAGE = 2
    CAPACITY = 14  # pages

    def __init__(self) -> None:
        super().__init__()
        self.manager = KVCacheManager(
            CONFIG, self.CAPACITY * self.PAGE * LAYER_TOKEN_BYTES + 3, page_size=self.PAGE)
        self.reqs: dict[str, dict[str, Any]] = {}
        self.prefixes: dict[str, dict[str, Any]] = {}
        self.tick = 0
        self.created = 0

    @initialize()
    def enable(self) -> None:
        self.manager.enable_prefix_cache()

    # -- model helpers --------------------------------------------------------------
    def shared(self, req: dict[str, Any], layer: dict[str, Any], index: int) -> bool:
        prefix = self.prefixes[req["prefix"]] if req["prefix"] else None
        if prefix is None or index >= prefix["pages"]:
            return False
        return not (index == prefix["pages"] - 1 and layer["copied"] is not None)

    def used(self) -> int:
        pages = sum(LAYERS * p["pages"] for p in self.prefixes.values())
        for req in self.reqs.values():
            for layer in req["layers"]:
                pages += sum(1 for i in range(layer["pages"]) if not self.shared(req, layer, i))
        return pages

    def ensure(self, pages: int) -> bool:
        """Evict unheld prefixes, least recently used first, if that makes room."""
        free = self.CAPACITY - self.used()
        if pages <= free:
            return True
        candidates = sorted((p["last_use"], p["order"], h) for h, p in self.prefixes.items()
                            if not p["holders"])
        gain, chosen = 0, []
        for _, _, h in candidates:
            if free + gain >= pages:
                break
            chosen.append(h)
            gain += LAYERS * self.prefixes[h]["pages"]
        if free + gain < pages:
            return False
        for h in chosen:
            del self.prefixes[h]
        return True

    def open(self, rid: str, pages: int, committed: int, prefix: str | None) -> None:
        self.reqs[rid] = {"prefix": prefix, "layers": [
            {"pages": pages, "committed": committed, "own": {}, "copied": None}
            for _ in range(LAYERS)]}

    # -- rules ---------------------------------------------------------------------------
    @rule(rid=IDS, prompt=st.integers(0, 9))
    def allocate_paged(self, rid: str, prompt: int) -> None:
        pages = cdiv(prompt, self.PAGE)
        ok = rid not in self.reqs and self.ensure(LAYERS * pages)
        assert self.manager.allocate_paged(rid, prompt) is ok
        if ok:
            self.open(rid, pages, 0, None)

    @rule(rid=IDS, h=st.sampled_from(["x", "y", "z"]), prefix_tokens=st.integers(0, 7),
          unique=st.integers(0, 5))
    def allocate_with_prefix(self, rid: str, h: str, prefix_tokens: int, unique: int) -> None:
        known = self.prefixes.get(h)
        if prefix_tokens and known is not None and known["tokens"] != prefix_tokens:
            expect_call(lambda: self.manager.allocate_with_prefix(rid, h, prefix_tokens, unique),
                        ValueError)
            return
        if prefix_tokens == 0:
            self.allocate_paged(rid, unique)
            return
        n = cdiv(prefix_tokens, self.PAGE)
        u = cdiv(prefix_tokens + unique, self.PAGE) - n
        if rid in self.reqs:
            ok = False
        elif known is not None:
            known["holders"].add(rid)  # locked before eviction is planned
            ok = self.ensure(LAYERS * u)
            known["holders"].discard(rid)
        else:
            ok = self.ensure(LAYERS * (n + u))
        assert self.manager.allocate_with_prefix(rid, h, prefix_tokens, unique) is ok
        if not ok:
            return
        self.tick += 1
        if known is None:
            self.created += 1
            known = self.prefixes[h] = {"tokens": prefix_tokens, "pages": n, "holders": set(),
                                        "content": [{} for _ in range(LAYERS)],
                                        "order": self.created}
            committed = 0
        else:
            committed = prefix_tokens
        known["holders"].add(rid)
        known["last_use"] = self.tick
        self.open(rid, n + u, committed, h)

    @rule(rid=IDS, layer=LAYER, key=VECTOR, value=VECTOR)
    def append(self, rid: str, layer: int, key: list[float], value: list[float]) -> None:
        req = self.reqs.get(rid)
        method = self.manager.append_token_paged if len(self.reqs) % 2 else self.manager.append_token
        call = lambda: method(rid, layer, key, value)  # noqa: E731
        if req is None:
            expect_call(call, KeyError)
            return
        if not 0 <= layer < LAYERS or len(key) != WIDTH or len(value) != WIDTH:
            expect_call(call, ValueError)
            return
        model = req["layers"][layer]
        position = model["committed"]
        entry = ([half(x) for x in key], [half(x) for x in value])
        index = position // self.PAGE
        if position < model["pages"] * self.PAGE and self.shared(req, model, index):
            prefix = self.prefixes[req["prefix"]]
            if position < prefix["tokens"]:
                expect_call(call, None)
                prefix["content"][layer][position] = entry
            else:  # copy-on-write of the partial last prefix page
                if not self.ensure(1):
                    expect_call(call, OutOfMemory)
                    return
                expect_call(call, None)
                start = index * self.PAGE
                model["copied"] = {q: prefix["content"][layer].get(q, ZERO)
                                   for q in range(start, prefix["tokens"])}
                model["own"][position] = entry
        elif position < model["pages"] * self.PAGE:
            expect_call(call, None)
            model["own"][position] = entry
        else:
            if not self.ensure(1):
                expect_call(call, OutOfMemory)
                return
            expect_call(call, None)
            model["pages"] += 1
            model["own"][position] = entry
        model["committed"] += 1

    @rule(data=st.data(), count=st.integers(1, 4))
    def append_valid(self, data: st.DataObject, count: int) -> None:
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        for _ in range(count):
            for layer in range(LAYERS):
                self.append(rid, layer, data.draw(vectors()), data.draw(vectors()))

    @rule(rid=IDS)
    def free(self, rid: str) -> None:
        req = self.reqs.pop(rid, None)
        expect_call(lambda: self.manager.free(rid), KeyError if req is None else None)
        if req is not None and req["prefix"]:
            self.tick += 1
            prefix = self.prefixes[req["prefix"]]
            prefix["holders"].discard(rid)
            prefix["last_use"] = self.tick

    @rule(rid=IDS, prompt=st.integers(1, 3))
    def basic_calls_are_refused(self, rid: str, prompt: int) -> None:
        expect_call(lambda: self.manager.allocate(rid, prompt, 1), ModeError)

    # -- checks ----------------------------------------------------------------------------
    def expected_kv(self, req: dict[str, Any], layer: int) -> list[Any]:
        model = req["layers"][layer]
        prefix = self.prefixes[req["prefix"]] if req["prefix"] else None
        out = []
        for position in range(model["committed"]):
            if prefix is not None and position < prefix["tokens"]:
                copied = model["copied"]
                if copied is not None and position in copied:
                    out.append(copied[position])
                else:
                    out.append(prefix["content"][layer].get(position, ZERO))
            else:
                out.append(model["own"][position])
        return out

    def stored(self) -> int:
        size = self.PAGE
        total = sum(LAYERS * sum(min(max(p["tokens"] - j * size, 0), size)
                                 for j in range(p["pages"])) for p in self.prefixes.values())
        for req in self.reqs.values():
            for model in req["layers"]:
                for i in range(model["pages"]):
                    if not self.shared(req, model, i):
                        total += min(max(model["committed"] - i * size, 0), size)
        return total

    @invariant()
    def agrees_with_the_model(self) -> None:
        page_bytes = self.PAGE * LAYER_TOKEN_BYTES
        used = self.used()
        total = self.CAPACITY * page_bytes + 3
        assert self.manager.stats() == {
            "total_memory_bytes": total, "used_memory_bytes": used * page_bytes,
            "num_active_requests": len(self.reqs),
            "total_cached_tokens": sum(r["layers"][0]["committed"] for r in self.reqs.values()),
            "utilization_pct": used * page_bytes / total * 100}
        expected = self.stored() / (used * self.PAGE) if used else 0.0
        assert self.manager.memory_efficiency() == expected
        for rid, req in self.reqs.items():
            for layer in range(LAYERS):
                keys, values = self.manager.get_kv(rid, layer)
                assert list(zip(keys, values, strict=True)) == self.expected_kv(req, layer)
        assert check(self.manager.engine.state) == []


class OddPagedMachine(PagedMachine):
    PAGE = 3
    CAPACITY = 10


TestBasicMachine = BasicMachine.TestCase
TestPagedMachine = PagedMachine.TestCase
TestOddPagedMachine = OddPagedMachine.TestCase
