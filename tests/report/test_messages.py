"""Messages that agree with each other and with the verdict, on real small runs (run in-process
through ``gradleak.cli.main``):

* a closed form that read 4 of 6 inputs exactly says what it did (no "budget" after 0 iterations),
  and every summary shows the worst image's PSNR beside the mean (a 72 dB mean hid 14 dB);
* a report.html headed "leaked" shows no "did not converge ... not evidence the client is safe"
  box, and no page says that sentence twice;
* under DP-SGD, auto's reason follows its member's evidence: an answer that fits the update only
  as well as the true data would does not "explain" it;
* a dashboard over a folder of single runs labels each run by what it attacked (the update's own
  record), and keeps a text run and an image run apart (two clients, not one attacked two ways).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from gradleak.attacks.auto import fit_words, floor_only
from gradleak.attacks.verdict import verdict
from gradleak.cli import main
from gradleak.data import batch_of, open_source
from gradleak.defenses.floor import noise_floor
from gradleak.defenses.spec import client_update
from gradleak.models import ModelSpec
from gradleak.pipeline import attack_update

FAST = ["--no-progress", "--threads", "1", "--no-paper-metrics"]
# Fashion-MNIST at 8 px through an mlp of width 16 behind a 200-row trap layer: 4 of the 6 inputs
# fire rows alone (read off exactly, 100 dB), 2 are mixtures (14-16 dB); the mean is 72 dB
TRAP = ["--attack", "trap", "--server", "trap:rows=200", "--model", "mlp", "--width", "16", "--data", "fashion-mnist",
        "--image-size", "8", "--batch-size", "6"]
SAFE = "not evidence that the client is safe"

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def run_cli(args, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().out


def summary_of(page: str) -> str:
    """The report's summary section, the folded evidence left out."""
    part = page[page.index("<h2>Summary</h2>"):page.index("<h2>What was attacked</h2>")]
    return re.sub(r"<details>.*?</details>", "", part, flags=re.S)


@pytest.fixture(scope="module")
def trap_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trap") / "run"
    assert main(["attack", *TRAP, *FAST, "--out", str(out)]) == 0
    return out


# ================================================================== 1. a closed form says what it did
def test_closed_form_says_k_of_k_exact_and_the_worst_image(trap_run, tmp_path, capsys):
    m = json.loads((trap_run / "metrics.json").read_text())
    psnrs = sorted(r["psnr"] for r in m["per_image"])
    assert m["verdict"] == "leaked" and m["closed_form"] is True and m["separated"] == 4 and m["converged"] is False
    assert psnrs[0] < 20 < m["psnr_mean"] and psnrs[-1] >= 60  # the mean hides the mixtures
    reason = m["convergence"]["reason"]
    assert "budget" not in reason and "closed form (no iterations)" in reason and "4 of 6 inputs" in reason
    # the console: the worst image beside the mean, the inputs read exactly, no budget
    code, out = run_cli(["attack", *TRAP, *FAST, "--out", tmp_path / "again"], capsys)
    assert code == 0
    worst = min(m["per_image"], key=lambda r: r["psnr"])
    assert re.search(rf"psnr_min\s*│\s*{worst['psnr']:.3f} \(worst image: {re.escape(worst['name'])}\)", out), out
    assert re.search(r"inputs separated\s*│\s*4 of 6 inputs exact", out)
    assert "computed in closed form (no iterations)" in out and "budget" not in out
    # the report
    page = summary_of((trap_run / "report.html").read_text())
    assert f"PSNR (worst image: {worst['name']})" in page and f"{worst['psnr']:.2f} dB" in page
    assert "Inputs read off exactly (closed form)</th><td>4 of 6" in page


# ================================================================== 2. the page's boxes agree with the verdict
def test_a_leaked_report_shows_no_not_safe_box(trap_run):
    page = summary_of((trap_run / "report.html").read_text())
    assert 'class="outcome v-leaked"' in page
    assert "did not converge" not in page and SAFE not in page and 'class="notice"><b>' not in page
    assert "own fit</b>: a closed form that read 4 of 6 inputs off the update exactly" in page


def test_a_non_converged_report_says_not_safe_once(tmp_path, capsys):
    out = tmp_path / "idlg"
    code, _ = run_cli(["attack", "--attack", "idlg", "--iterations", "1", *FAST, "--out", out], capsys)
    assert code == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["converged"] is False and m["verdict"] == "inconclusive"
    page = summary_of((out / "report.html").read_text())
    assert "The attack did not converge." in page and page.count(SAFE) == 1, page


# ================================================================== 3. auto's words follow the evidence
def _tiny_sigmoid_net() -> ModelSpec:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 2, 4, stride=4), nn.Sigmoid(), nn.Flatten(), nn.Linear(50, 10))
    return ModelSpec(name="custom", module=module, input_shape=(3, 20, 20), num_classes=10,
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def test_auto_under_dpsgd_does_not_say_explains():
    """DP-SGD noise 1 leaves even the true photo at a relative distance ~1: an answer there fits
    the update as well as the truth, which says nothing about a rebuilt input."""
    model = _tiny_sigmoid_net()
    batch = batch_of(open_source("cifar10-samples"), [0], 20, 3)
    update = client_update(model, batch, ["dpsgd:clip=1,noise=1"], torch.Generator().manual_seed(0))
    rec = attack_update(update, model, "auto", iterations=2, threads=1)
    auto = rec.extra["auto"]
    kept = next(t for t in auto["tried"] if t["attack"] == auto["used"])
    assert kept["converged"] is True and kept["relative_gradient_distance"] > 0.5
    assert "explains the update" not in auto["why"], auto["why"]
    assert "only as well as the true data would" in auto["why"] and "no sign of a rebuilt input" in auto["why"]
    # a closed form "converged" on the same floor is worded the same way; one below it explains it
    floor = noise_floor(update)
    at_floor = verdict("rgap", {"relative_gradient_distance": floor.mean, "closed_form": True}, floor)
    assert at_floor.converged and floor_only(at_floor) and "explains" not in fit_words(at_floor)
    clean = verdict("rgap", {"relative_gradient_distance": 1e-12, "closed_form": True})
    assert not floor_only(clean) and fit_words(clean).startswith("explains the update")


# ================================================================== 4. the dashboard labels what was attacked
def test_dashboard_over_runs_labels_what_was_attacked(tmp_path, capsys):
    runs = tmp_path / "runs"
    update = tmp_path / "u.safetensors"
    assert main(["share", "--defense", "dpsgd:clip=1,noise=1", "--out", str(update)]) == 0
    for name, args in (("text-tag", ["--modality", "text", "--attack", "tag", "--text", "the rent went up again",
                                     "--iterations", "2"]),
                       ("update-idlg", ["--update", update, "--attack", "idlg", "--iterations", "2"])):
        flags = FAST[:3] if name.startswith("text") else FAST  # --no-paper-metrics is the image runs'
        assert main(["attack", *[str(a) for a in args], *flags, "--out", str(runs / name)]) == 0
    capsys.readouterr()
    page_file = tmp_path / "dash.html"
    assert main(["dashboard", str(runs), "--out", str(page_file)]) == 0
    page = page_file.read_text()
    cells = page[page.index("All cells (worst first)"):]
    rows = {name: row for row in cells.split("<tr")[1:] for name in ("text-tag", "update-idlg") if f">{name}<" in row}
    assert set(rows) == {"text-tag", "update-idlg"}
    assert "cifar10-samples" not in rows["text-tag"] and ">text<" in rows["text-tag"]
    assert ">dpsgd:clip=1,noise=1<" in rows["update-idlg"] and ">none<" not in rows["update-idlg"]
    assert ">tiny-transformer<" in rows["text-tag"] and ">lenet-dlg<" in rows["update-idlg"]
    # two clients: the text run and the image run are not one client attacked two ways
    worst = page[page.index("Worst case over the attacks, per client setting"):page.index("Verdict per setting")]
    assert worst.count("<tr") - 1 == 2 and ">text<" in worst and ">image<" in worst, worst


def test_the_text_report_uses_the_same_boxes():
    """The text and the image report share page.verdict_notice (run_page, their one skeleton): a
    leaked text run shows no "not safe" box, an inconclusive one says it once (the text page had
    kept the old, doubling notice)."""
    from gradleak.report.page import verdict_notice

    reason = "the relative distance 0.5 is above its line 0.1; low scores here are not evidence that the client is safe"
    leaked = {"converged": False, "verdict": "leaked", "verdict_reason": "1 sentence(s) recovered exactly",
              "convergence": {"reason": reason, "relative_gradient_distance": 0.5, "threshold": 0.1}}
    assert SAFE not in verdict_notice(leaked) and "did not converge" not in verdict_notice(leaked)
    inconclusive = {**leaked, "verdict": "inconclusive", "verdict_reason": "no text recovered"}
    assert verdict_notice(inconclusive).lower().count(SAFE.lower()) == 1
    from gradleak.report import run_page

    assert run_page.verdict_notice is verdict_notice   # the one run report skeleton, both modalities
