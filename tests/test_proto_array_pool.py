"""The array-pool prototype (tools/proto_array_pool.py) makes the decisions kvstate's pool
makes, and refuses what the rules refuse, so its cost figures in docs/benchmarks-vllm.md
measure the same work."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from kvstate.vllm.block_pool import BlockPool

TOOLS = Path(__file__).resolve().parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
from proto_array_pool import ArrayPool, BlockAlloc, BlockRelease, Refused  # noqa: E402


def queue_of(pool: ArrayPool) -> list[int]:
    return pool.engine.state.free_pages.head(10**6)


@pytest.mark.parametrize("seed", range(20))
def test_same_blocks_and_free_queue_as_the_pool(seed: int) -> None:
    rng = random.Random(seed)
    proto, real = ArrayPool(40), BlockPool(40, True, 16)
    held: list[tuple[list, list]] = []
    for _ in range(150):
        if held and rng.random() < 0.45:
            mine, theirs = held.pop(rng.randrange(len(held)))
            order = list(range(len(mine)))
            rng.shuffle(order)
            proto.free_blocks([mine[i] for i in order])
            real.free_blocks([theirs[i] for i in order])
        else:
            count = rng.randint(0, 9)
            if count > real.get_num_free_blocks():
                with pytest.raises(ValueError):
                    proto.get_new_blocks(count)
                continue
            mine, theirs = proto.get_new_blocks(count), real.get_new_blocks(count)
            assert [b.block_id for b in mine] == [b.block_id for b in theirs]
            held.append((mine, theirs))
        assert queue_of(proto) == real.free_block_ids()


def test_refused_events_change_nothing() -> None:
    pool = ArrayPool(10)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks[:1])
    queue, holders = queue_of(pool), list(pool.engine.state.holders)
    hostile = [
        BlockRelease(0, (blocks[0].block_id,), True, False),  # double free
        BlockRelease(0, (blocks[1].block_id, blocks[1].block_id), True, False),
        BlockRelease(0, (99,), True, False),  # outside the pool
        BlockAlloc(0, (queue[1],)),  # not the head
        BlockAlloc(0, (queue[0], queue[0])),
        BlockAlloc(0, (99,)),
        BlockAlloc(7, (queue[0],)),  # a holder the prototype does not cover
    ]
    for event in hostile:
        with pytest.raises(Refused):
            pool.engine.emit(event)
        assert queue_of(pool) == queue
        assert pool.engine.state.holders == holders
    with pytest.raises(TypeError):
        pool.free_blocks([ArrayPool(10).blocks[2]])  # a view of another pool
