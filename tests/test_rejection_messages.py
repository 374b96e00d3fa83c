"""Rejection messages are part of the rules' contract: each names the precondition it broke.

Replay failures, ``kvstate check`` counterexamples and ``InvalidEvent`` show
them to users, so a rule that rejects for the right reason with the wrong
text (or none) is a bug too.  A deterministic search over the event-level
scopes (radix P = 1 and 2, SGLang's row writes, the block pool, the host
tier, and the FULL + SWA and FULL + Mamba hybrids) collects the distinct
messages of every rejected candidate; they must equal the recorded set in
``tests/data/rejection_messages.json``.  After an
intended change of wording, regenerate it::

    python -m tests.test_rejection_messages
"""

from __future__ import annotations

import json
import sys
from collections import deque
from pathlib import Path

import pytest

from kvstate.backends.persistent import apply_valid
from kvstate.checking.enabled import candidate_events
from kvstate.checking.levels import geometry_of
from kvstate.checking.scopes import SCOPES
from kvstate.errors import InvalidEvent
from kvstate.state import initial_state

GOLDEN = Path(__file__).parent / "data" / "rejection_messages.json"
SCOPE_NAMES = ("tiny", "paged", "rows-sglang", "rows-sglang-paged", "block", "block-paged", "host",
               "swa", "mamba")
STATES = 1500  # per scope, in breadth-first order


def messages(scope_name: str) -> list[str]:
    """Distinct rejection messages (event class: text) over the first ``STATES`` states."""
    scope = SCOPES[scope_name]
    start = initial_state(geometry_of(scope), host_pages=scope.host_pages,
                          swa_pages=scope.swa_pages, mamba_slots=scope.mamba_slots)
    seen = {start.fingerprint()}
    queue = deque([start])
    found: set[str] = set()
    expanded = 0
    while queue and expanded < STATES:
        state = queue.popleft()
        expanded += 1
        for event in candidate_events(state, scope):
            try:
                child = apply_valid(state, event)
            except InvalidEvent as exc:
                found.add(f"{type(event).__name__}: {exc.precondition}")
                continue
            fingerprint = child.fingerprint()
            if fingerprint not in seen:
                seen.add(fingerprint)
                queue.append(child)
    return sorted(found)


@pytest.mark.parametrize("scope", SCOPE_NAMES)
def test_rejection_messages_are_the_recorded_ones(scope):
    recorded = json.loads(GOLDEN.read_text())[scope]
    current = messages(scope)
    assert len(recorded) > 5
    assert current == recorded, (sorted(set(current) - set(recorded))[:5],
                                 sorted(set(recorded) - set(current))[:5])


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({name: messages(name) for name in SCOPE_NAMES}, indent=1) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
