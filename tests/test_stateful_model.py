"""Both backends and the spec model side by side under hypothesis, in each mode.

``SpecMachine`` (radix rows, pages and tree, with ``Scatter`` and
``FreeMapped``), ``BlockSpecMachine`` (vLLM's block pool) and
``HostSpecMachine`` (the radix machine on a state with a host tier): after
every step the persistent and live backends agree, both agree with
``specs.model``, and every ALWAYS and TRANSITIONS property holds
(``kvstate.testing.backends_machine``).
"""

from __future__ import annotations

from kvstate.testing.machine import SpecMachine
from kvstate.testing.machines import BlockSpecMachine, HostSpecMachine

TestSpecMachine = SpecMachine.TestCase
TestBlockSpecMachine = BlockSpecMachine.TestCase
TestHostSpecMachine = HostSpecMachine.TestCase
