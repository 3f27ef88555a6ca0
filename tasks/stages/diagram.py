"""The pipeline's diagram and step table, rendered from the one stage list (tasks/stages/stage_list.py) into marked
blocks of the docs by `torchship config-docs`, so no doc keeps a list of steps by hand:

    <!-- generated:diagram:start -->
    (rendered: never edit by hand)
    <!-- generated:diagram:end -->
"""
from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path

from tasks.stages.stage_list import PREFECT_STEPS, SERVE, Step, dvc_steps, summary_steps

BLOCK = re.compile(r"(?P<start><!-- generated:(?P<name>[\w-]+):start -->\n)(?P<body>.*?)(?P<end><!-- generated:"
                   r"(?P=name):end -->)", re.S)
DOCS = ("README.md", "docs/architecture.md", "docs/getting-started.md")   # where the blocks are
MIN_WIDTH = 11   # a column: the step's name, its arrow, and its caption wrapped to this width less one
LOOP = 'retrain flow ◄── Prefect event "drift detected" ◄── monitor flow (Evidently on the request log + feedback) ◄─'


def diagram(steps: list[Step], cached: int) -> str:
    """The steps left to right, arrows between, each captioned below its name; the first `cached` are DVC stages;
    then the closed loop back from the service."""
    columns = [*steps, SERVE]
    widths = [max(len(step.name) + 4, MIN_WIDTH, 2 + max(map(len, f"({step.does})".split()))) for step in columns]
    widths[-1] += 4   # the last caption has the room to its right
    names = "".join(step.name + (" " + "─" * (width - len(step.name) - 3) + "► " if i < len(columns) - 1 else "")
                    for i, (step, width) in enumerate(zip(columns, widths, strict=True)))
    captions = [textwrap.wrap(f"({step.does})", width - 1, break_long_words=False)
                for step, width in zip(columns, widths, strict=True)]
    rows = ["".join(lines[row].ljust(width) if row < len(lines) else " " * width
                    for lines, width in zip(captions, widths, strict=True)).rstrip()
            for row in range(max(map(len, captions)))]
    prefect_at = sum(widths[:cached])
    header = "DVC stages (cached by file and param hashes)".ljust(prefect_at) + \
        "Prefect-only (live registry and service state)"
    serve_at = sum(widths[:-1])
    loop = LOOP + "─" * max(0, serve_at - len(LOOP)) + "┘"
    lines = [header, names, *rows, " " * serve_at + "│", loop]
    return "```\n" + "\n".join(" " + line for line in lines) + "\n```\n"


def steps_table(steps: list[Step]) -> str:
    """One row per step of a run's summary: its status words and what its headline says."""
    rows = "".join(f"| {step.name} | {step.statuses} | {step.headline} |\n" for step in steps)
    return "| step | status | the headline says |\n| --- | --- | --- |\n" + rows


def renderers(root: Path) -> dict[str, Callable[[], str]]:
    """Each block's name -> its rendered body, from the stage list of the project at `root`."""
    stages = dvc_steps(root)
    return {"diagram": lambda: diagram(stages + list(PREFECT_STEPS), len(stages)),
            "steps": lambda: steps_table(summary_steps(root))}


def render_blocks(text: str, root: Path) -> str:
    """`text` with every generated block's body rendered anew; an unknown block name is an error."""
    known = renderers(root)

    def body(match: re.Match) -> str:
        if match["name"] not in known:
            raise KeyError(f"unknown generated block '{match['name']}' (known: {', '.join(known)})")
        return match["start"] + known[match["name"]]() + match["end"]

    return BLOCK.sub(body, text)


def write_blocks(root: Path) -> list[Path]:
    """Render the blocks of every doc in DOCS; returns the docs that changed."""
    changed = []
    for name in DOCS:
        path = root / name
        text = path.read_text()
        if (rendered := render_blocks(text, root)) != text:
            path.write_text(rendered)
            changed.append(path)
    return changed
