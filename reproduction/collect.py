"""Copy a finished experiment folder into reproduction/NAME, beside the paper.

    python reproduction/collect.py NAME OUT_DIR

OUT_DIR is the folder `gradleak experiment NAME --out OUT_DIR ...` wrote. Copied: every CSV
(results.csv, summary.csv, ...), results.md, experiment.json and the figures (the cell store, OUT_DIR/cells, stays
where it is: it is what makes a rerun recompute nothing). results.md gets the hand-written
reading of reproduction/NAME/reading.md appended (the paper's numbers beside ours, where we agree
and where we do not), and command.txt records the command that regenerates the folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def collect(name: str, out_dir: Path) -> Path:
    dest = HERE / name
    dest.mkdir(exist_ok=True)
    doc = json.loads((out_dir / "experiment.json").read_text())
    for f in sorted({p.name for p in out_dir.glob("*.csv")} | {"experiment.json", *doc.get("figures", [])}):
        if (out_dir / f).is_file():
            shutil.copy2(out_dir / f, dest / f)
    md = (out_dir / "results.md").read_text()
    reading = dest / "reading.md"
    if reading.is_file():
        md = md.rstrip() + "\n\n" + reading.read_text().strip() + "\n"
    (dest / "results.md").write_text(md)
    command = (f"gradleak experiment {name} --out reproduction/{name}/run --workers 1 --threads 1\n"
               "# then: python reproduction/collect.py " + name + " reproduction/" + name + "/run\n")
    (dest / "command.txt").write_text(command)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(collect(sys.argv[1], Path(sys.argv[2])))
