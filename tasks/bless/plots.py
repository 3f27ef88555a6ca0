"""bless's plots for the MLflow run: quality per slice (candidate vs champion); latency per model is
tasks.core.plots.plot_latency."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.core.plots import pyplot, save_figure


def plot_slices(slices: dict[str, dict], metric: str, path: Path) -> bool:
    """One panel per slice column: the bless metric per slice for the candidate (and the champion, with the
    paired interval of the difference drawn on the candidate's bar). False when there is nothing to draw."""
    columns = {name: report["slices"] for name, report in slices.items() if report.get("slices")}
    if not columns:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(columns), figsize=(4.5 * len(columns), 3.8), squeeze=False)
    for ax, (column, groups) in zip(axes[0], columns.items()):
        names = list(groups)
        x = np.arange(len(names))
        candidate = np.array([g["candidate"] for g in groups.values()])
        has_champion = all("champion" in g for g in groups.values())
        width = 0.4 if has_champion else 0.6
        # Error bar = the interval of (candidate - champion), placed on the candidate's bar: judged slices only.
        low = [g["candidate"] - (g["difference"] - g["low"]) if g["judged"] else g["candidate"]
               for g in groups.values()]
        high = [g["candidate"] + (g["high"] - g["difference"]) if g["judged"] else g["candidate"]
                for g in groups.values()]
        judged = any(g["judged"] for g in groups.values())
        ax.bar(x - (width / 2 if has_champion else 0), candidate, width, label="candidate",
               yerr=[candidate - np.array(low), np.array(high) - candidate] if judged else None, capsize=3)
        if has_champion:
            ax.bar(x + width / 2, [g["champion"] for g in groups.values()], width, label="champion")
        ax.set_xticks(x, [f"{n}\n({g['rows']})" for n, g in groups.items()], fontsize=8)
        ax.set(title=f"{metric} per {column}", ylim=(0, 1.05))
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(plt, fig, path)
    return True
