"""Every shell command in the README runs from the root of a fresh copy of the repository.

The copy holds what a clone holds (tracked files, plus untracked files that
git does not ignore, so work in progress is checked too), and nothing from
beside the repository: a command that needs ``../shared`` or a file the
README never made fails here.  Installing and running the test suite are
left out (CI does both itself).  A command's expected exit status is 0
unless its trailing comment says ``# exit N``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SKIPPED = ("pip install", "python -m pytest")  # CI's own install and test steps


def readme_commands() -> list[tuple[str, int]]:
    """(command, expected exit status) for each command line of the README's bash blocks."""
    found: list[tuple[str, int]] = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                command, _, comment = part.partition(" #")
                command = command.strip()
                if not command or command.startswith(SKIPPED):
                    continue
                expected = re.match(r"\s*exit (\d+)", comment)  # "# exit N..." only
                found.append((command, int(expected.group(1)) if expected else 0))
    return found


COMMANDS = readme_commands()


def test_the_readme_commands_were_found():
    names = [command.split()[1] for command, _ in COMMANDS if command.startswith("kvstate ")]
    assert {"replay", "record", "diff", "minimize", "verify", "simulate", "check"} <= set(names)
    assert any(expected == 1 for _, expected in COMMANDS)  # the failing examples say so


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    root = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return root


@pytest.mark.parametrize(("command", "expected"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_runs_from_a_fresh_copy(command: str, expected: int, fresh_copy: Path):
    argv = shlex.split(command)
    if argv[0] == "kvstate":
        argv = [sys.executable, "-m", "kvstate.cli", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    env = {**os.environ, "PYTHONPATH": str(fresh_copy)}
    result = subprocess.run(argv, cwd=fresh_copy, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == expected, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr
