"""Reference model of the kvstate core: plain dicts, sets and lists.

Written from docs/design.md, docs/vllm.md, the event docstrings and the
invariants, not from the rules.  It favours obviousness over speed: every
event works on a deep copy of the whole model, checks every precondition by
scanning, and derives what the rules keep incrementally.  It covers every
event kind: rows and pages and the radix tree (``specs.model_radix``,
``specs.model_tree``), the block pool of vLLM mode (``specs.model_block``)
and the host tier (``specs.model_host``).

``step(model, event)`` returns a new ``ModelState`` or raises ``ModelReject``;
it never mutates its input.

Mode decision (specs/SPEC.md): a block-mode state takes the block events,
``ReqAlloc``, ``ReqFree`` and ``Reset("rows" | "pages")``; the other radix
events have no vLLM meaning there (a radix insert is not a block, a bare
``Allocate`` ignores the queue head and the cache) and are rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specs import model_block, model_host, model_radix, model_tree
from specs.model_state import (
    DETACHED,
    ROOT,
    MNode,
    ModelHost,
    ModelReject,
    ModelState,
    MRequest,
    clone,
    initial_model,
)

Rule = Callable[[ModelState, Any], None]

RULES: dict[str, Rule] = {
    "ReqAlloc": model_radix.req_alloc, "ReqFree": model_radix.req_free,
    "Allocate": model_radix.allocate, "Append": model_radix.append,
    "Assign": model_radix.assign, "Scatter": model_radix.scatter, "Share": model_radix.share,
    "Truncate": model_radix.truncate, "Free": model_radix.free,
    "FreeMapped": model_radix.free_mapped, "Copy": model_radix.copy,
    "Insert": model_tree.insert, "Split": model_tree.split, "Touch": model_tree.touch,
    "Lock": model_tree.lock, "Unlock": model_tree.unlock, "Evict": model_tree.evict,
    "Reset": model_tree.reset,
    "BlockAlloc": model_block.block_alloc, "BlockHold": model_block.block_hold,
    "BlockRelease": model_block.block_release, "BlockCache": model_block.block_cache,
    "BlockUncache": model_block.block_uncache, "BlockClear": model_block.block_clear,
    "Offload": model_host.offload, "Load": model_host.load, "HostFree": model_host.host_free,
}

BLOCK_MODE_EVENTS = frozenset({"ReqAlloc", "ReqFree", "Reset", "BlockAlloc", "BlockHold",
                               "BlockRelease", "BlockCache", "BlockUncache", "BlockClear"})


def step(m: ModelState, event: Any) -> ModelState:
    """The model after ``event``; raises ``ModelReject`` (``m`` unchanged) if it is illegal."""
    name = type(event).__name__
    rule = RULES.get(name)
    if rule is None:
        raise ModelReject(f"no model rule for {name}")
    if m.mode == "block" and name not in BLOCK_MODE_EVENTS:
        raise ModelReject(f"{name} does not apply to a block-mode state")
    out = clone(m)
    rule(out, event)
    return out


def step_hybrid(m: Any, event: Any) -> Any:
    """A FULL + SWA hybrid's model (``specs.model_swa.HybridModel``: this core model plus an
    SWA pool) after a core or an SWA event (``kvstate.events.swa``)."""
    from specs.model_swa import step_hybrid as step_swa

    return step_swa(m, event)


def step_with_mamba(m: Any, event: Any) -> Any:
    """A cache with a Mamba pool's model (``specs.model_mamba.MambaModel``: the model of the
    rest of the cache plus the Mamba pool) after any of its events."""
    from specs.model_mamba import step_mamba

    return step_mamba(m, event)


def step_any(m: Any, event: Any) -> Any:
    """``step`` for whichever model ``m`` is: a ``MambaModel``, a ``HybridModel`` (FULL +
    SWA) or the core ``ModelState`` (what ``specs.abstraction.abstract_any`` returns)."""
    if isinstance(m, ModelState):
        return step(m, event)
    from specs.model_mamba import MambaModel

    return step_with_mamba(m, event) if isinstance(m, MambaModel) else step_hybrid(m, event)


__all__ = ["DETACHED", "ROOT", "RULES", "MNode", "ModelHost", "ModelReject", "ModelState",
           "MRequest", "clone", "initial_model", "step", "step_any", "step_hybrid",
           "step_with_mamba"]
