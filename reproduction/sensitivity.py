"""How far the committed conclusions hang on GradInversion's and Inverting Gradients' convergence
line (relative gradient distance 0.4, gradleak/outcome.py): per folder, the runs of those two
attacks and how many of them would change their ``converged`` flag if the line were half (0.2) or
double (0.8).

    python reproduction/sensitivity.py            # prints the markdown table of reproduction/README.md

Reads only the committed results.csv files (one row per image; an attack on a batch repeats its
run's distance on each image's row, so the counts are over images). A verdict that says "leaked"
does not depend on the line (a rebuilt image leaks whether or not the attack converged); what does
are the converged / not-converged counts and the means over converged runs the folders report.
"Converged as recorded" can differ from the count at 0.4: a GradInversion run with no prior and no
group term is held to DLG's line (attacks/verdict.py line_family: ablation's first step,
gradient-loss's L_grad-alone rows), and a defended update's line adds its noise floor.
"""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = 0.4
LOW, HIGH = LINE / 2, LINE * 2
GI_IG = ("gradinversion", "ig")
# Folders whose every row is a GradInversion run (no attack column).
ALL_GI = ("ablation", "identifiability", "identifiability-fashion-mnist", "identifiability-trained",
          "feature-extractor", "gradient-loss", "gradinversion-imagenet")


def attack_of(folder: str, row: dict[str, str]) -> str | None:
    if folder in ALL_GI:
        return "gradinversion"
    name = row.get("attack") or row.get("method") or ""
    return next((a for a in GI_IG if name.startswith(a)), None)


def counts(path: Path) -> tuple[int, int, int, int, int] | None:
    """(rows of GI/IG with a distance, recorded converged, converged at 0.4, at 0.2, at 0.8)."""
    folder = path.parent.name
    values, recorded = [], 0
    with path.open() as f:
        for row in csv.DictReader(f):
            if attack_of(folder, row) is None or not row.get("relative_gradient_distance"):
                continue
            values.append(float(row["relative_gradient_distance"]))
            recorded += row.get("converged") == "True"
    if not values:
        return None
    return (len(values), recorded, sum(v <= LINE for v in values), sum(v <= LOW for v in values),
            sum(v <= HIGH for v in values))


def main() -> None:
    print(f"| folder | GI/IG image rows | converged as recorded | at the line {LINE:g} | at {LOW:g} | at {HIGH:g} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in sorted(HERE.glob("*/results.csv")):
        c = counts(path)
        if c is not None:
            print(f"| {path.parent.name} | " + " | ".join(str(v) for v in c) + " |")


if __name__ == "__main__":
    main()
