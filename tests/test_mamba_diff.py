"""The Mamba differential against the real SGLang 0.5.23 (slow; needs the peer venv).

Runs ``tools/diff_sglang_mamba.py`` on every configuration with a few
seeds and both tree cores; the full run (40 seeds x 150 ops) is in
docs/hybrid-mamba.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.diff_sglang_mamba import main

PEERS = Path(os.environ.get("PEERS", Path.home() / "kvstate-peers"))


@pytest.mark.slow
@pytest.mark.skipif(not (PEERS / "venv-sglang" / "bin" / "python").exists(),
                    reason="the SGLang 0.5.23 peer venv is not installed")
def test_sglang_and_kvstate_agree(capsys):
    assert main(["--seeds", "3", "--steps", "120"]) == 0, capsys.readouterr().out
