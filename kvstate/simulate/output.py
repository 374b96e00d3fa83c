"""Result files of a sweep: ``results.csv``, ``results.json`` and ``hit_rate.png``.

Every file carries the measurement definition: a ``definition`` column in
the CSV, a key in each JSON record, and the plot's caption.  Writing creates
``out_dir`` if needed and overwrites these three files; nothing else there
is touched.  matplotlib is imported only for the plot (optional extra).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from kvstate.simulate.settings import SimulationResult

CSV_NAME = "results.csv"
JSON_NAME = "results.json"
PLOT_NAME = "hit_rate.png"


def write_csv(results: Sequence[SimulationResult], path: Path) -> None:
    rows = [result.to_json() for result in results]
    if not rows:
        path.write_text("", encoding="utf-8")
        return
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_json(results: Sequence[SimulationResult], path: Path) -> None:
    document = {"results": [result.to_json() for result in results]}
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def write_plot(results: Sequence[SimulationResult], path: Path) -> bool:
    """Hit rate (token-weighted) vs capacity, one line per policy; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(7, 4.5))
    policies = sorted({r.settings.policy for r in results})
    for policy in policies:
        points = sorted(
            (r.settings.capacity_tokens, r.hit_rate_tokens) for r in results if r.settings.policy == policy
        )
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
    axes.set_xscale("log")
    axes.set_xlabel("cache capacity (tokens)")
    axes.set_ylabel("prefix hit rate (token-weighted)")
    axes.set_ylim(bottom=0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(title="policy")
    if results:
        first = results[0]
        axes.set_title(first.trace, fontsize=10)
        caption = first.definition.replace(f"capacity {first.capacity_pages} pages; ", "")
        figure.text(0.01, 0.01, _wrap(caption, 120), fontsize=6, va="bottom")
        figure.subplots_adjust(bottom=0.28)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def _wrap(text: str, width: int) -> str:
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return "\n".join(lines)


def write_results(results: Sequence[SimulationResult], out_dir: str | Path) -> list[Path]:
    """Write the CSV, JSON and PNG into ``out_dir``; returns the paths written."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / CSV_NAME, folder / JSON_NAME]
    write_csv(results, written[0])
    write_json(results, written[1])
    if write_plot(results, folder / PLOT_NAME):
        written.append(folder / PLOT_NAME)
    return written
