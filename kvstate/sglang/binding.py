"""How the SGLang objects find their shared engine.

SGLang's constructors do not pass the request pool to the allocator, yet the
two must share one state.  A ``ReqToTokenPool`` built without ``engine=``
creates an engine and leaves it *open*; the next allocator built without
``engine=`` joins the newest open engine that has no allocator yet (and
configures its pages).  ``RadixCache`` then checks both sit on one engine.
This is the only module-level state in the front end, and it holds weak
references only.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from kvstate.engine import Engine
from kvstate.events import Event
from kvstate.state import Geometry, State

_open_engines: list[weakref.ref[Engine]] = []


class FrontEndMixin:
    """Read access to the shared engine for users and tests (the front end reads ``engine.view``)."""

    engine: Engine

    @property
    def state(self) -> State:
        """The current state, frozen (costs a freeze after changes: not for hot paths)."""
        return self.engine.state

    @property
    def events(self) -> Sequence[Event]:
        return self.engine.events


def engine_for_pool(num_rows: int, row_width: int, engine: Engine | None) -> Engine:
    if engine is not None:
        if engine.seq == 0:
            engine.configure(num_rows=num_rows, row_width=row_width)
        elif (engine.geometry.num_rows, engine.geometry.row_width) != (num_rows, row_width):
            raise ValueError("the engine already holds request rows of another shape")
        return engine
    created = Engine(Geometry(num_pages=1, num_rows=num_rows, row_width=row_width))
    _open_engines.append(weakref.ref(created))
    return created


def engine_for_allocator(num_pages: int, page_size: int, engine: Engine | None) -> Engine:
    if engine is None:
        while _open_engines:
            candidate = _open_engines.pop()()
            if candidate is not None and candidate.seq == 0:
                engine = candidate
                break
        _open_engines.clear()
    if engine is None:
        return Engine(Geometry(num_pages=num_pages, page_size=page_size))
    if engine.seq == 0:
        engine.configure(num_pages=num_pages, page_size=page_size)
    elif (engine.geometry.num_pages, engine.geometry.page_size) != (num_pages, page_size):
        raise ValueError("the engine already holds a pool of another size or page size")
    return engine
