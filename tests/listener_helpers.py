"""A listener that fails at commits, for the tests that a front end stays in step with the
engine when a listener raises ``ListenerError`` after a batch's events were applied."""

from __future__ import annotations

from typing import Any


class FailingListener:
    """Fails at the commit of every ``every``-th batch it sees (then the engine detaches it)."""

    def __init__(self, every: int) -> None:
        self.every, self.seen = every, 0

    def after(self, events: Any, view: Any) -> None:
        self.seen += 1
        if self.seen % self.every == 0:
            raise RuntimeError("listener failure")
