"""The README's Python examples run as written (fragments that name user code are skipped)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvstate import InvalidEvent

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_runnable_examples():
    runnable = [block for block in BLOCKS if "MyPolicy" not in block]
    assert len(runnable) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch, capsys):
    block = BLOCKS[index]
    if "MyPolicy" in block:
        pytest.skip("a fragment: it names the reader's own policy class")
    monkeypatch.chdir(tmp_path)  # examples that write a log write it here
    code = compile(block, f"README.md python block {index}", "exec")
    if "# raises InvalidEvent" in block:
        with pytest.raises(InvalidEvent):
            exec(code, {})
        return
    exec(code, {})
