"""Issue 37: the verdicts on photos the project was not tuned on (scikit-image / scikit-learn photos,
never in the sample sets): iDLG on the DLG LeNet, one photo per run, undefended and under Gaussian 0.1,
Gaussian 1 and DP-SGD (clip 1, noise 1), each through `gradleak attack` as a user runs it (which runs
the positive control itself when "defended" lacks only that). Records per run the verdict, its reason,
PSNR, the answer's and the truth's relative gradient distance and the control's verdict and PSNR.
Writes benchmarks/outcome_photos.json (about 4 minutes, one thread).

    .venv/bin/python benchmarks/outcome_photos.py [--photos astronaut,coffee,chelsea]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFENSES = ([], ["gaussian:0.1"], ["gaussian:1"], ["dpsgd:clip=1,noise=1"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", default="astronaut,coffee,chelsea")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    from robustness import build_photo_set

    from gradleak.cli import main as gradleak

    names = tuple(args.photos.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        photos = build_photo_set(Path(tmp) / "photos", names)
        for i, name in enumerate(names):
            for defenses in DEFENSES:
                out = Path(tmp) / f"run-{i}-{len(rows)}"
                argv = ["attack", "--attack", "idlg", "--data", str(photos), "--indices", str(i), "--threads", "1",
                        "--no-progress", "--out", str(out), *(a for d in defenses for a in ("--defense", d))]
                with contextlib.redirect_stdout(io.StringIO()):
                    assert gradleak(argv) == 0, argv
                m = json.loads((out / "metrics.json").read_text())
                c = m.get("control") or {}
                rows.append({"photo": name, "defenses": defenses, "verdict": m["verdict"],
                             "reason": m["verdict_reason"], "psnr": round(m["psnr_mean"], 2),
                             "answer_distance": m.get("relative_gradient_distance"),
                             "truth_distance": m.get("truth_relative_distance"),
                             "control": c.get("verdict"), "control_psnr": c.get("psnr_mean")})
                print(json.dumps(rows[-1]), flush=True)
    result = {"command": "gradleak attack --attack idlg --data PHOTOS --indices I [--defense D]",
              "cpu": platform.processor() or platform.machine(), "rows": rows}
    (HERE / "outcome_photos.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
