"""The decode-heavy serving run the hybrid executor benchmarks record (``bench_executor_swa``,
``bench_executor_mamba``), on any SGLang hybrid front end and its scheduler module.

Requests share one of 4 system prompts, up to 8 run at once, each decodes 8..96 tokens.  An
admission that does not fit is undone (``flows.undo_admit``) and retried after the oldest
running request finished early; a decode step that does not fit finishes the oldest.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any


def serve(cache: Any, flows: Any, new_req: Callable[[int, list[int]], Any], requests: int,
          rng: random.Random, **decode_options: Any) -> None:
    """Run ``requests`` requests through ``flows`` (``admit``, ``undo_admit``,
    ``prefill_done``, ``decode_step``, ``finish``) on ``cache``."""
    systems = [[rng.randint(1, 50) for _ in range(rng.randint(20, 60))] for _ in range(4)]
    waiting = [(rng.choice(systems) + [rng.randint(1, 50) for _ in range(rng.randint(4, 40))],
                rng.randint(8, 96)) for _ in range(requests)]
    running: list[tuple[Any, int]] = []
    number = 0
    while waiting or running:
        if waiting and len(running) < 8:
            tokens, budget = waiting.pop(0)
            req = new_req(number, tokens)
            number += 1
            try:
                flows.admit(cache, req)
            except MemoryError:
                flows.undo_admit(cache, req)
                waiting.insert(0, (tokens, budget))
                if not running:
                    raise
                flows.finish(cache, running.pop(0)[0])
                continue
            flows.prefill_done(cache, req, rng.randint(1, 50))
            running.append((req, budget))
        try:
            flows.decode_step(cache, [req for req, _ in running], rng.randint(1, 50),
                              **decode_options)
        except MemoryError:
            flows.finish(cache, running.pop(0)[0])
        for item in [item for item in running if len(item[0].output_ids) >= item[1]]:
            running.remove(item)
            flows.finish(cache, item[0])


__all__ = ["serve"]
