"""The sample trace shipped inside the package (``kvstate simulate --sample``).

Owned by ``kvstate.traces``.  ``data/`` holds the first 1,000 requests of the
Mooncake FAST'25 conversation trace with its Apache-2.0 license and a README
stating the source and the change made (``data/README.md``).  It ships as
package data, so a fresh clone or a wheel needs nothing outside the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

SAMPLE_NAME = "mooncake_conversation_1000.jsonl"
SAMPLE_FILES = (SAMPLE_NAME, "LICENSE-APACHE-2.0.txt", "README.md")


@contextmanager
def sample_trace() -> Iterator[Path]:
    """A filesystem path to the sample trace, valid inside the ``with`` block.

    ``importlib.resources`` gives the installed file itself, or a temporary
    copy when the package is imported from an archive.
    """
    with resources.as_file(resources.files("kvstate.traces") / "data" / SAMPLE_NAME) as path:
        yield path
