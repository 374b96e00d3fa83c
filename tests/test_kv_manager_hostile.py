"""KVCacheManager under hostile input: every rejected call is a typed error that changes nothing.

``Snapshot`` captures everything a call could change: the core state's
fingerprint, the events committed, the mode switches, every stored K/V
value (``get_kv`` of every active request and layer) and the raw bytes of
the executor's buffers.  Each test builds a manager with some history
(basic, or paged with a shared prefix and a copy-on-write), makes a bad
call and compares the snapshot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from kvstate import ModelConfig, OutOfMemory, check
from kvstate.errors import ListenerError
from kvstate.kv_manager import KVCacheManager

TINY = ModelConfig(num_layers=2, num_kv_heads=1, head_dim=2)  # 16 bytes per token, 8 per layer
IDS = ("a", "b")


class Snapshot:
    def __init__(self, manager: KVCacheManager) -> None:
        engine = manager.engine
        self.core = (engine.state.fingerprint(), len(engine.events), manager.mode,
                     manager.prefix_cache_enabled)
        active = [r for r in IDS if f"req/{r}" in engine.state.requests]
        self.values = {(r, layer): manager.get_kv(r, layer)
                       for r in active for layer in range(TINY.num_layers)}
        store = manager._store
        self.buffers: list[torch.Tensor] = []
        if store is not None:
            for layer in range(store.executor.layer_num):
                self.buffers.extend(t.clone() for t in store.executor.get_kv_buffer(layer))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (self.core == other.core and self.values == other.values
                and len(self.buffers) == len(other.buffers)
                and all(torch.equal(x, y) for x, y in zip(self.buffers, other.buffers, strict=True)))


def basic_manager() -> KVCacheManager:
    manager = KVCacheManager(TINY, 10 * TINY.bytes_per_token)
    assert manager.allocate("a", 2, 2) and manager.allocate("b", 1, 0)
    manager.append_token("a", 0, [1.0, 2.0], [3.0, 4.0])
    return manager


def paged_manager() -> KVCacheManager:
    manager = KVCacheManager(TINY, 12 * 4 * 8, page_size=4)
    manager.enable_prefix_cache()
    assert manager.allocate_with_prefix("a", "sys", 6, 2)
    for t in range(6):
        for layer in range(2):
            manager.append_token("a", layer, [t, layer], [-t, 0.5])
    assert manager.allocate_with_prefix("b", "sys", 6, 2)
    manager.append_token("b", 0, [7.0, 7.0], [7.0, 7.0])  # copy-on-write of the shared page
    return manager


def refuses(manager: KVCacheManager, error: type[BaseException], call: Any,
            match: str | None = None) -> None:
    before = Snapshot(manager)
    with pytest.raises(error, match=match):
        call()
    assert Snapshot(manager) == before
    assert check(manager.engine.state) == []


# -- vectors -------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [basic_manager, paged_manager])
@pytest.mark.parametrize("shape", [(2, 2), (2, 3), (1, 1, 2), (4,), (2, 1), ()])
def test_a_wrongly_shaped_tensor_commits_nothing(make, shape):
    # Seed-002 regression: a (2, 3) key passed the length check (len == 2), the
    # token was committed, and only the buffer write raised.
    manager = make()
    refuses(manager, ValueError,
            lambda: manager.append_token("a", 1, torch.ones(shape), [1.0, 2.0]), "shape|values")
    refuses(manager, ValueError,
            lambda: manager.append_token("a", 1, [1.0, 2.0], torch.ones(shape)), "shape|values")


@pytest.mark.parametrize("make", [basic_manager, paged_manager])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_infinity_are_refused(make, bad):
    manager = make()
    refuses(manager, ValueError, lambda: manager.append_token("a", 0, [bad, 1.0], [1.0, 1.0]),
            "NaN or an infinity")
    refuses(manager, ValueError,
            lambda: manager.append_token("a", 0, [1.0, 1.0], torch.tensor([1.0, bad])),
            "NaN or an infinity")


def test_a_value_the_storage_dtype_cannot_hold_is_refused():
    manager = basic_manager()
    refuses(manager, ValueError, lambda: manager.append_token("a", 0, [70000.0, 0], [0, 0]),
            "outside the torch.float16 range")
    refuses(manager, ValueError, lambda: manager.append_token("a", 0, [10**400, 0], [0, 0]),
            "too large")
    manager.append_token("a", 0, [65504.0, -65504.0], [0, 0])  # the largest float16 is fine
    assert manager.get_kv("a", 0)[0][-1] == [65504.0, -65504.0]


@pytest.mark.parametrize("bad", [
    "ab", None, 3.0, [True, False], [1 + 2j, 0.0], ["1", "2"], [None, 1.0], {0: 1.0, 1: 2.0},
    torch.tensor([True, False]), torch.tensor([1 + 1j, 2 + 0j]), np.array(["a", "b"])],
    ids=repr)
def test_vectors_of_anything_but_real_numbers_are_type_errors(bad):
    manager = paged_manager()
    refuses(manager, TypeError, lambda: manager.append_token("a", 0, bad, [1.0, 1.0]))
    refuses(manager, TypeError, lambda: manager.append_token("a", 0, [1.0, 1.0], bad))


def test_tensors_arrays_and_integer_entries_are_real_numbers():
    manager = basic_manager()
    manager.append_token("a", 0, torch.tensor([[5, -6]]), np.array([0.5, 0.25], np.float32))
    manager.append_token("a", 0, (np.float64(1.5), 2), torch.tensor([1.0, 2.0],
                                                                     dtype=torch.float64))
    keys, values = manager.get_kv("a", 0)
    assert keys[1:] == [[5.0, -6.0], [1.5, 2.0]] and values[1:] == [[0.5, 0.25], [1.0, 2.0]]


# -- ids, layers, sizes ---------------------------------------------------------------------
@pytest.mark.parametrize("make", [basic_manager, paged_manager])
def test_unknown_ids_double_free_and_bad_layers(make):
    manager = make()
    refuses(manager, KeyError, lambda: manager.append_token("zz", 0, [1, 1], [1, 1]))
    refuses(manager, KeyError, lambda: manager.get_kv("zz", 0))
    refuses(manager, KeyError, lambda: manager.free("zz"))
    manager.free("b")
    refuses(manager, KeyError, lambda: manager.free("b"))  # double free
    refuses(manager, KeyError, lambda: manager.append_token("b", 0, [1, 1], [1, 1]))
    for bad_id in (5, None, b"a", ["a"]):
        refuses(manager, TypeError, lambda bad_id=bad_id: manager.free(bad_id))
        refuses(manager, TypeError, lambda bad_id=bad_id: manager.get_kv(bad_id, 0))
    for layer, error in ((2, ValueError), (-1, ValueError), (10**30, ValueError),
                         (0.0, TypeError), (True, TypeError), ("0", TypeError)):
        refuses(manager, error, lambda layer=layer: manager.append_token("a", layer, [1, 1], [1, 1]))
        refuses(manager, error, lambda layer=layer: manager.get_kv("a", layer))
    manager.append_token("a", np.int64(1), [1, 1], [1, 1])  # numpy ints are ints


def test_request_ids_that_no_log_could_hold_are_refused():
    manager = basic_manager()
    refuses(manager, ValueError, lambda: manager.allocate("x" * 5000, 1, 1), "characters")
    refuses(manager, ValueError, lambda: manager.allocate("\ud800", 1, 1), "Unicode")
    refuses(manager, TypeError, lambda: manager.allocate(7, 1, 1))
    assert manager.allocate("x" * 4000, 1, 1)  # long ids that fit are fine
    paged = paged_manager()
    refuses(paged, ValueError, lambda: paged.allocate_with_prefix("c", "\udfff", 4, 1), "Unicode")
    refuses(paged, TypeError, lambda: paged.allocate_with_prefix("c", None, 4, 1))
    refuses(paged, ValueError, lambda: paged.allocate_paged("\ud800", 1), "Unicode")


BAD_SIZES = [((-1, 1), ValueError), ((1, -1), ValueError), ((1.0, 1), TypeError),
             ((True, 1), TypeError), (("3", 1), TypeError), ((None, 1), TypeError)]


@pytest.mark.parametrize("args, error", [*BAD_SIZES, ((0, 0), ValueError)])
def test_bad_sizes_are_typed_errors_in_basic_mode(args, error):
    manager = basic_manager()
    refuses(manager, error, lambda: manager.allocate("c", *args))


@pytest.mark.parametrize("args, error", BAD_SIZES)
def test_bad_sizes_are_typed_errors_in_paged_mode(args, error):
    manager = paged_manager()
    refuses(manager, error, lambda: manager.allocate_with_prefix("c", "sys", *args))
    bad = args[0] if args[1] == 1 else args[1]  # the one bad size of the pair
    refuses(manager, error, lambda: manager.allocate_paged("c", bad))


@pytest.mark.parametrize("make", [basic_manager, paged_manager])
def test_absurd_sizes_are_refused_with_false_and_change_nothing(make):
    manager = make()
    before = Snapshot(manager)
    for size in (2**63, 2**64 + 1, 10**30):
        if manager.mode == "basic":
            assert manager.allocate("c", size, 0) is False
            assert manager.allocate("c", 1, size) is False
        else:
            assert manager.allocate_paged("c", size) is False
            assert manager.allocate_with_prefix("c", "sys", 6, size) is False
            assert manager.allocate_with_prefix("c", "new", size, 0) is False
        assert Snapshot(manager) == before


# -- construction ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error", [
    ({"max_gpu_memory_bytes": 2**80}, ValueError),  # 2**76 tokens: beyond int32 page ids
    ({"max_gpu_memory_bytes": -1}, ValueError),
    ({"max_gpu_memory_bytes": 1.5e9}, TypeError),
    ({"max_gpu_memory_bytes": True}, TypeError),
    ({"page_size": 0}, ValueError),
    ({"page_size": True}, TypeError),
    ({"dtype": torch.int16}, TypeError),  # would truncate every value to an integer
    ({"dtype": torch.float32}, ValueError),  # 4 bytes, the config says 2
    ({"dtype": "float16"}, TypeError),
    ({"device": "tpu"}, ValueError),
    ({"device": 3}, TypeError),
    ({"mode": "fast"}, ValueError),
])
def test_bad_construction_is_refused_up_front(kwargs, error):
    arguments: dict[str, Any] = {"max_gpu_memory_bytes": 160, **kwargs}
    with pytest.raises(error):
        KVCacheManager(TINY, **arguments)


def test_bfloat16_storage_is_accepted_and_checked_against_its_range():
    manager = KVCacheManager(TINY, 160, dtype=torch.bfloat16)
    manager.allocate("a", 1, 1)
    manager.append_token("a", 0, [1e38, 0.5], [0, 0])  # finite in bfloat16
    refuses(manager, ValueError, lambda: manager.append_token("a", 0, [1e39, 0], [0, 0]))


def test_value_buffers_that_cannot_be_allocated_are_a_typed_error():
    # 1 PiB of K/V buffers exceeds any address space: torch refuses at once.
    config = ModelConfig(num_layers=64, num_kv_heads=64, head_dim=256)  # 4 MiB per token
    manager = KVCacheManager(config, 2**50)
    assert manager.allocate("a", 1, 0)
    before = (manager.engine.state.fingerprint(), len(manager.engine.events))
    with pytest.raises(OutOfMemory, match="K/V buffers"):
        manager.append_token("a", 0, [0.0] * 64 * 256, [0.0] * 64 * 256)
    assert (manager.engine.state.fingerprint(), len(manager.engine.events)) == before
    assert manager.get_kv("a", 0) == ([], [])


class BrokenListener:
    """An engine listener that fails on every batch (a log on a full disk)."""

    def after(self, events: Any, view: Any) -> None:
        raise OSError("disk full")


def test_a_failing_listener_leaves_the_values_in_step_with_the_committed_events():
    manager = paged_manager()
    manager.free("a")  # a's pages, written, go back to the head of the free list
    manager.free("b")
    manager.engine.subscribe(BrokenListener())
    with pytest.raises(ListenerError, match="disk full"):
        manager.allocate_with_prefix("c", "new", 4, 0)  # registered on a's old pages
    manager.engine.subscribe(BrokenListener())
    with pytest.raises(ListenerError, match="disk full"):
        manager.append_token("c", 1, [5.0, 6.0], [7.0, 8.0])  # committed: the values too
    assert manager.allocate_with_prefix("d", "new", 4, 0)
    assert manager.get_kv("d", 1) == ([[5.0, 6.0]] + [[0.0, 0.0]] * 3,
                                      [[7.0, 8.0]] + [[0.0, 0.0]] * 3)
    assert check(manager.engine.state) == []
