"""The reducer and the spec model side by side under hypothesis (``kvstate.testing.SpecMachine``).

Runs with the proposed fixes of ``tests/spec_fixes.py`` installed while the
core still has the findings listed there (each finding has its own xfail
test in ``test_spec_findings.py``).
"""

from __future__ import annotations

import pytest

from kvstate.testing.machine import SpecMachine
from tests.spec_fixes import proposed_fixes


@pytest.fixture(autouse=True)
def _fixes():
    with proposed_fixes():
        yield


TestSpecMachine = SpecMachine.TestCase
