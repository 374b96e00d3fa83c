"""The reducer and the spec model side by side under hypothesis (``kvstate.testing.SpecMachine``)."""

from __future__ import annotations

from kvstate.testing.machine import SpecMachine

TestSpecMachine = SpecMachine.TestCase
