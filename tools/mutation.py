"""Mutation testing of the rules and the planner: ``python -m tools.mutation``.

Not part of CI (hours of CPU).  Needs ``pip install '.[mutation]'`` (mutmut).  Copies
``kvstate/``, ``specs/``, ``tests/``, ``tools/`` and ``pyproject.toml`` into a scratch
directory (``--work``, default ``kvstate-mutation`` in the system's temporary
directory), writes mutmut's
configuration there (``setup.cfg``: mutate only ``kvstate/rules/*`` and
``kvstate/planner/*``, run a focused test selection that stops at the first
failure), runs ``mutmut run`` and prints the score and every surviving
mutant.  The repository itself is never touched, so the command can run
beside other work.  ``--report`` only re-reads a finished run.

The focused selection (``TESTS``) is the fast part of the suite that checks
rules and planner semantics: both backends' rejections, the spec findings,
the front ends' scenarios (SGLang, vLLM, the seed-002 manager's planner),
the single-group vLLM manager's refusals, idle shortcut and KV events, the
seed-002 manager and examples, the SGLang front ends' frees, writes and
tables, the incremental checker, the policies, the host-tier planner and its
stateful machine, the hybrid (SWA and Mamba) rules, examples and random runs
against the spec model, vLLM's hybrid coordinator (its scenarios, call forms
and idle fast path), the planner's pinned choices, the recorded peer
transcripts of the hybrid differentials (the planners' decisions against
SGLang's and vLLM's), and six pinned explorer scopes (spec model on every
candidate event: radix P = 1 and 2, rows, block, paged block, host).
mutmut runs, per mutant, only the selected tests that reach the mutated
function, fastest first.  ``--only rules`` or
``--only planner`` mutates one package (the two take about 1 and 3 to 4 hours
of CPU on the 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPIED = ("kvstate", "specs", "tests", "tools", "pyproject.toml")  # tools: the hybrid runs' generators
PINS = ("tiny", "paged", "rows-sglang-paged", "block", "block-paged", "host")
TESTS = (  # fast ones first: a mutant stops at its first failing test (-x)
    "tests/test_rule_rejects.py",
    "tests/test_rejection_messages.py",
    "tests/test_spec_findings.py",
    "tests/test_kv_manager_planner.py",
    "tests/test_planner_choices.py",
    "tests/test_planner_flows.py",
    "tests/test_peer_transcripts.py",  # the hybrid planners' decisions against the peers'
    "tests/test_sglang_params.py",
    "tests/test_sglang_scenarios.py",
    "tests/test_vllm_scenarios.py",
    "tests/test_incremental_differential.py",
    # the hybrid rules (SWA, Mamba): rejections, the worked examples, the fused decisions,
    # and random runs where both backends, the spec model and the checks must agree
    "tests/test_swa_rules.py",
    "tests/test_mamba_rules.py",
    "tests/test_swa_examples.py",
    "tests/test_mamba_examples.py",
    "tests/test_swa_decode.py",
    "tests/test_swa_decode_planner.py",
    "tests/test_swa_extend.py",
    "tests/test_swa_runs.py::test_backends_model_and_checks_agree",
    "tests/test_mamba_runs.py::test_backends_model_and_checks_agree",
    # vLLM's hybrid coordinator (per-group hits, skipped blocks, Mamba align, idle steps)
    "tests/test_vllm_hybrid.py",
    "tests/test_vllm_hybrid_api.py",
    "tests/test_vllm_hybrid_idle.py",
    "tests/test_vllm_planner.py",
    # the single-group vLLM manager (sliding window included), its refusals, idle shortcut
    # and KV events; the seed-002 manager; the SGLang front ends' frees, writes and tables
    "tests/test_vllm_manager.py",
    "tests/test_vllm_rejects.py",
    "tests/test_vllm_fast_paths.py",
    "tests/test_vllm_kv_events.py",
    "tests/test_vllm_hashing.py",
    "tests/test_simulate_vllm.py",
    "tests/test_kv_manager.py",
    "tests/test_kv_manager_example.py",
    "tests/test_seed_examples.py",
    "tests/test_sglang_frees.py",
    "tests/test_sglang_hardening.py",
    "tests/test_sglang_write.py",
    "tests/test_sglang_table.py",
    "tests/test_mamba_front_end.py",
    "tests/test_policy_check.py::test_builtin_priorities_and_the_loader_in_one_fast_pass",
    "tests/test_host_tier.py",  # the tiered planner's scenarios and its stateful machine
    *(f"tests/test_explore_small.py::test_pinned_scope[{name}]" for name in PINS),
)
AREAS = {"rules": ("kvstate/rules/*",), "planner": ("kvstate/planner/*",),
         "all": ("kvstate/rules/*", "kvstate/planner/*")}


def prepare(work: Path, mutated: tuple[str, ...]) -> None:
    """A fresh copy of the sources and mutmut's configuration in ``work``."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "mutants", "failures")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=ignore)
        else:
            shutil.copy2(source, work / name)
    for path in (work / "kvstate" / "rules").glob("*.py"):
        path.write_text(register_after(path.read_text()))

    def listing(items: tuple[str, ...]) -> str:
        return "".join(f"\n    {item}" for item in items)

    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = kvstate/\n"
        f"only_mutate ={listing(mutated)}\n"
        f"also_copy ={listing(('specs/', 'tools/'))}\n"
        f"pytest_add_cli_args_test_selection ={listing(TESTS)}\n"
        f"pytest_add_cli_args ={listing(('-x', '-q', '-p', 'no:cacheprovider'))}\n")


_RULE = re.compile(r"^@rule\((\w+)\)\n(def (\w+)\()", re.M)


def register_after(source: str) -> str:
    """``@rule(E) def f`` -> ``def f`` plus ``rule(E)(f)`` at the end of the module.

    mutmut does not instrument decorated functions, and every rule body is
    decorated with its registration; registering after the definition is the
    same registry, in the same order, with the bodies open to mutation.  Only
    the scratch copy is rewritten.
    """
    registered = [(event, name) for event, _, name in _RULE.findall(source)]
    if not registered:
        return source
    body = _RULE.sub(r"\2", source)
    lines = "".join(f"rule({event})({name})\n" for event, name in registered)
    return f"{body}\n\n# Registered here (tools/mutation.py) so the bodies can be mutated.\n{lines}"


def results(work: Path) -> dict[str, str]:
    """Mutant name -> mutmut's status ("killed", "survived", "no tests", "timeout", ...)."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, str] = {}
    for meta in sorted((work / "mutants").rglob("*.meta")):
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        for name, code in codes.items():
            out[name] = status_by_exit_code[code]
    return out


def report(work: Path, exclude: tuple[str, ...] = ()) -> int:
    """Score per file and in all (killed or timed out, over those tested or untested), then
    every survivor's diff.  Mutants whose name contains an ``exclude`` string are left out."""
    outcomes = {n: o for n, o in results(work).items() if not any(x in n for x in exclude)}
    by_file: dict[str, dict[str, int]] = {}
    for name, outcome in outcomes.items():
        module = name.split(".x")[0] if ".x" in name else name
        tally = by_file.setdefault(module, {})
        tally[outcome] = tally.get(outcome, 0) + 1
    for module, tally in sorted([*by_file.items(), ("all", _sum(by_file.values()))]):
        killed = tally.get("killed", 0) + tally.get("timeout", 0)
        judged = killed + tally.get("survived", 0) + tally.get("no tests", 0)
        score = f"{100 * killed / judged:.1f}%" if judged else "-"
        detail = ", ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        print(f"{module}: {score} killed of {judged} ({detail})")
    for name in sorted(n for n, o in outcomes.items() if o == "survived"):
        shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work,
                               capture_output=True, text=True)
        diff = [line for line in shown.stdout.splitlines() if line[:1] in "+-"
                and not line.startswith(("+++", "---"))]
        print(f"\nsurvived: {name}\n" + "\n".join(diff))
    return 0


def _sum(tallies: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for tally in tallies:
        for key, value in tally.items():
            total[key] = total.get(key, 0) + value
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "kvstate-mutation"),
                        help="scratch directory")
    parser.add_argument("--max-children", type=int, default=2, help="parallel test processes")
    parser.add_argument("--only", choices=sorted(AREAS), default="all",
                        help="mutate the rules, the planner, or both")
    parser.add_argument("--report", action="store_true", help="only report a finished run")
    parser.add_argument("--exclude", default="", help="comma-separated name parts to leave out "
                                                      "of the report (e.g. swa,mamba)")
    args = parser.parse_args(argv)
    work = Path(args.work)
    if not args.report:
        prepare(work, AREAS[args.only])
        env = dict(os.environ, CI="true")  # the ci hypothesis profile: derandomised, no database
        code = subprocess.run([sys.executable, "-m", "mutmut", "run",
                               "--max-children", str(args.max_children)], cwd=work, env=env).returncode
        if code not in (0, 1):
            return code
    return report(work, tuple(x for x in args.exclude.split(",") if x))


if __name__ == "__main__":
    sys.exit(main())
