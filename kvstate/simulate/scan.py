"""One streaming pass over a trace before any simulation: what the runs need to know up front.

Owned by ``kvstate.simulate``; ``kvstate simulate`` calls ``scan_trace``
once.  The pass validates every line (a malformed trace fails before the
first run rather than minutes into it), counts the requests (the warmup
window and the progress total need the count), bounds the pages any run
can occupy (``page_bound``, which keeps huge capacities cheap), and sums
the tokens, which sizes the slow-setting warnings.  It holds one request at
a time and mutates nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from kvstate.simulate.driver import pages_needed
from kvstate.simulate.settings import Granularity, SimulationSettings
from kvstate.traces.records import TraceRequest


@attrs.frozen
class TraceScan:
    """What one pass over a trace found (for the granularity it was scanned in)."""

    first: TraceRequest | None
    requests: int
    page_bound: int  # the most pages one run can occupy: a larger pool never evicts
    prompt_tokens: int
    output_tokens: int
    granularity: Granularity
    unit_tokens: int  # tokens per page: the trace's block size (block) or --page-size (token)

    @property
    def has_prefix_data(self) -> bool:
        """Whether the trace says which prompts share a prefix (hash blocks); Azure 2023 does not."""
        return self.first is None or self.first.block_size > 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def pages_per_block(self) -> int:
        """Pages of one trace hash block in token granularity (1 in block granularity)."""
        if self.first is None or not self.first.block_size or self.granularity == "block":
            return 1
        return max(1, -(-self.first.block_size // self.unit_tokens))


def choose_granularity(first: TraceRequest | None, requested: Granularity | None) -> Granularity:
    """``requested``, or block granularity when the trace has hash blocks and token otherwise."""
    if requested is not None:
        return requested
    return "block" if first is not None and first.block_size else "token"


def scan_trace(
    requests: Iterable[TraceRequest],
    requested: Granularity | None,
    page_size: int,
    on_request: Callable[[int], None] | None = None,
) -> TraceScan:
    """Stream ``requests`` once; ``on_request(count)`` is called after each (progress)."""
    first: TraceRequest | None = None
    granularity: Granularity = requested or "token"
    unit = page_size
    shape = SimulationSettings(capacity_tokens=1, granularity=granularity, page_size=page_size)
    count = bound = prompt = output = 0
    for request in requests:
        if first is None:
            first = request
            granularity = choose_granularity(first, requested)
            unit = first.block_size if granularity == "block" and first.block_size else page_size
            shape = SimulationSettings(capacity_tokens=1, granularity=granularity, page_size=page_size)
        count += 1
        bound += pages_needed((request,), shape, max(unit, 1))
        prompt += request.prompt_length
        output += request.output_length
        if on_request is not None:
            on_request(count)
    return TraceScan(first, count, bound, prompt, output, granularity, unit)
