"""The docs name files that exist, link to docs that exist, and point nowhere outside the repository.

A backticked token counts as a repository path when it has a slash and its
last part ends in ``/`` or a known file extension (``kvstate/log/reader.py``,
``replay/seed/``, ``planner/kv_layout.py``), or when it is a bare file name
with such an extension (``reader.py``). A path must exist from the repository
root, from the doc's folder, from ``kvstate/`` or from ``replay/``; a bare name must be the name
of some file in the repository. Dotted names (``tests/vllm_helpers.admit``)
and patterns (``test_kv_events_*.py``) are not paths.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "replay" / "README.md"]
EXTENSIONS = ("py", "md", "kvlog", "json", "sh", "toml", "txt")
TICKED = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*(?:/|\.(?:" + "|".join(EXTENSIONS) + r"))$")
# Named on purpose although not in this repository.
NOT_HERE = {
    "sim.py",  # the peer benchmark driver, kept outside the repository (docs/benchmarks-core.md)
    "shared/peers/",  # where tools/bench_core.py looks for it, next to the checkout
    "shared/traces/azure_llm_inference_2023/",  # tools/bench_kv_manager.py's default trace folder
    "traces/trace_NNNN.json",  # a file of the kv-cache-tester repository (docs/results.md)
}
_NAMES: set[str] | None = None


def _file_names() -> set[str]:
    global _NAMES
    if _NAMES is None:
        skip = {".git", ".venv", "venv", "node_modules", "__pycache__"}
        _NAMES = {p.name for p in ROOT.rglob("*") if not skip.intersection(p.parts)}
    return _NAMES


def _missing(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    out = []
    for match in TICKED.finditer(text):
        token = match.group(1).strip()
        if token in NOT_HERE or token.startswith("../") or not PATH.match(token):
            continue
        line = text.count("\n", 0, match.start()) + 1
        if "/" in token:
            bases = (ROOT, doc.parent, ROOT / "kvstate", ROOT / "replay")
            if not any((base / token).exists() for base in bases):
                out.append(f"{doc.name}:{line}: {token}")
        elif token not in _file_names():
            out.append(f"{doc.name}:{line}: {token}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_named_in_backticks_exist(doc: Path) -> None:
    assert _missing(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    links = [t for t in LINK.findall(text) if "://" not in t]
    assert [t for t in links if not (doc.parent / t).exists()] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_paths_outside_the_repository(doc: Path) -> None:
    assert "../shared" not in doc.read_text(encoding="utf-8")


def test_the_docs_index_lists_every_doc() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = set(LINK.findall(index))
    docs = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert sorted(docs - listed) == []
