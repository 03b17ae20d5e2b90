"""``--attack auto`` on batches, FedAvg and aggregates runs a portfolio of optimisation attacks
(DLG, GradInversion, Inverting Gradients), keeps the answer that best explains the update from the
attacker's side, and, with ground truth, judges the client by the worst case over every attack
that ran."""

import json
import signal
from types import SimpleNamespace

import pytest
import torch

from gradleak.config import flat_config
from gradleak.attacks import Engine, resolve_attack
from gradleak.attacks.auto import auto_portfolio
from gradleak.attacks.configs import CONFIGS
from gradleak.engine import ATTACK_RUNNERS
from gradleak.attacks.reconstruction import Reconstruction
from gradleak.engine.checkpoints import state_dir_for
from gradleak.cli import main
from gradleak.data import open_source, sample_batch
from gradleak.errors import ConfigError, GradleakError
from gradleak.fl import fedsgd
from gradleak.models import build_model
from gradleak.outcome import LEAKED, Evidence, evidence_from_metrics, judge

FAST = ["--no-progress", "--threads", "1", "--no-paper-metrics"]


def _update(batch_size, side=32, **threat):
    return SimpleNamespace(meta=SimpleNamespace(batch_size=batch_size, threat=threat, input_shape=(3, side, side)))


def test_the_portfolio_follows_the_case():
    assert auto_portfolio(_update(1)) == ("idlg", "ig")
    assert auto_portfolio(_update(4)) == ("dlg", "gradinversion", "ig")
    assert auto_portfolio(_update(1, name="aggregate", clients=3)) == ("dlg", "gradinversion", "ig")
    assert auto_portfolio(_update(2, name="fedavg", local_steps=2)) == ("dlg", "gradinversion", "ig")
    # 224 px: DLG and IG would take hours a start on this CPU; GradInversion is built for it
    assert auto_portfolio(_update(8, side=224)) == ("gradinversion",)


def test_flags_reach_the_members_that_read_them_and_a_flag_none_reads_is_refused():
    cfg = resolve_attack({"attack": "auto", "seed": 3, "iterations": 7, "alpha_bn": 0.5, "restarts": 2,
                          "stall_restarts": 1}, bn_statistics_shared=True, portfolio=("dlg", "gradinversion", "ig"))
    dlg, gi, ig = cfg.portfolio
    assert cfg.members == ("dlg", "gradinversion", "ig")
    assert (dlg.iterations, gi.iterations, ig.iterations) == (7, 7, 7) and {dlg.seed, gi.seed, ig.seed} == {3}
    assert gi.alpha_bn == 0.5 and ig.restarts == 2 and dlg.stall_restarts == 1
    assert dlg.lr == 1.0 and ig.optimizer == "adam"  # each keeps its own defaults for what was not given
    with pytest.raises(ConfigError, match="--alpha-bn applies to none of the attacks auto runs here"):
        resolve_attack({"attack": "auto", "seed": 0, "alpha_bn": 0.5}, bn_statistics_shared=True,
                       portfolio=("dlg", "ig"))
    # --fallback narrows the portfolio to one attack, which reads (and refuses) every flag as before
    one = resolve_attack({"attack": "auto", "seed": 0, "fallback": "ig", "restarts": 2}, bn_statistics_shared=True,
                         portfolio=("dlg", "gradinversion", "ig"))
    assert one.members == ("ig",)
    with pytest.raises(ConfigError, match="does not apply to attack 'dlg'"):
        resolve_attack({"attack": "auto", "seed": 0, "fallback": "dlg", "restarts": 2}, bn_statistics_shared=True)


@pytest.fixture(scope="module")
def batch_update():
    """convnet (BatchNorm, ReLU): no closed form applies, so the portfolio runs."""
    model = build_model("convnet", num_classes=10, width=8, seed=0)
    batch = sample_batch(open_source("cifar10-samples"), 2, seed=0, image_size=32, channels=3)
    return model, fedsgd(model, batch)


def _fake(monkeypatch, distances, observed=None):
    """Replace the three members' runners: each returns a constant answer with the given relative
    gradient distance (an Exception instance: raised), and observes iteration 1 with its index."""
    calls = []
    for i, cls in enumerate(CONFIGS[name] for name in ("dlg", "gradinversion", "ig")):
        def run(cfg, update, model, engine, i=i):
            calls.append(cfg.attack)
            rel = distances[cfg.attack]
            if isinstance(rel, Exception):
                raise rel
            if engine.observer is not None:
                engine.observer(1, torch.zeros(2, 3, 32, 32))
            return Reconstruction(images=torch.full((2, 3, 32, 32), 0.1 * i), labels=torch.zeros(2, dtype=torch.long),
                                  iterations=5, wall_seconds=1.0, extra={"relative_gradient_distance": rel})
        monkeypatch.setitem(ATTACK_RUNNERS, cls, run)
    return calls


def _auto(model, update, observer=None, **values):
    cfg = resolve_attack({"attack": "auto", "seed": 0, **values}, bn_statistics_shared=False,
                         portfolio=("dlg", "gradinversion", "ig"))
    return Engine(observer=observer).run(cfg, update, model)


def test_the_answer_that_explains_the_update_best_is_kept(batch_update, monkeypatch):
    model, update = batch_update
    # DLG explains the update best although not within its own line (1e-5), while GI and IG are
    # within their coarse one (0.4): the smallest distance is kept, converged or not
    calls = _fake(monkeypatch, {"dlg": 0.05, "gradinversion": 0.3, "ig": 0.2})
    rec = _auto(model, update)
    assert calls == ["dlg", "gradinversion", "ig"] and rec.extra["attack_used"] == "dlg"
    auto = rec.extra["auto"]
    assert auto["portfolio"] == ["dlg", "gradinversion", "ig"] and set(auto["budget_iterations"]) == set(calls)
    assert [t["attack"] for t in auto["tried"] if t["applies"]] == calls
    assert "dlg's answer explains the update best (relative distance 5.00e-02, not within its line)" in auto["why"]
    assert [a for a, _ in rec.alternatives] == ["gradinversion", "ig"] and rec.wall_seconds == 3.0
    _fake(monkeypatch, {"dlg": 0.5, "gradinversion": 0.45, "ig": 0.9})
    assert _auto(model, update).extra["attack_used"] == "gradinversion"


def test_an_exact_answer_ends_the_portfolio(batch_update, monkeypatch):
    model, update = batch_update
    calls = _fake(monkeypatch, {"dlg": 1e-7, "gradinversion": 0.3, "ig": 0.2})
    rec = _auto(model, update)
    assert calls == ["dlg"] and rec.extra["attack_used"] == "dlg" and "not needed" in rec.extra["auto"]["why"]
    assert rec.alternatives == []


def test_members_that_refuse_are_recorded_and_only_all_refusing_ends_the_run(batch_update, monkeypatch):
    model, update = batch_update
    _fake(monkeypatch, {"dlg": GradleakError("dlg: too big"), "gradinversion": 0.3, "ig": GradleakError("ig: no")})
    rec = _auto(model, update)
    tried = {t["attack"]: t for t in rec.extra["auto"]["tried"]}
    assert rec.extra["attack_used"] == "gradinversion"
    assert tried["dlg"]["applies"] is False and tried["dlg"]["why"] == "dlg: too big"
    _fake(monkeypatch, {"dlg": GradleakError("a"), "gradinversion": GradleakError("b"), "ig": GradleakError("c")})
    with pytest.raises(GradleakError, match="^c$"):
        _auto(model, update)


def test_the_history_shows_the_kept_answers_observations(batch_update, monkeypatch):
    model, update = batch_update

    class Points:
        def __init__(self):
            self.points, self.calls = {}, 0

        def __call__(self, iteration, images):
            self.calls += 1
            self.points[iteration] = float(self.calls)   # 1.0 from DLG, 2.0 from GI, 3.0 from IG

    _fake(monkeypatch, {"dlg": 0.5, "gradinversion": 0.3, "ig": 0.9})
    obs = Points()
    rec = _auto(model, update, observer=obs)
    assert rec.extra["attack_used"] == "gradinversion" and obs.points == {1: 2.0}


def test_another_members_leak_is_the_clients_leak():
    tried = [{"attack": "gradinversion", "applies": True, "converged": True},
             {"attack": "dlg", "applies": True, "converged": False, "verdict": LEAKED,
              "verdict_reason": "rebuilt: PSNR 23.9 dB >= 20 dB"}]
    metrics = {"attack": "gradinversion", "psnr_mean": 11.7, "ssim_mean": 0.3, "converged": True,
               "per_image": [{"ssim": 0.3}], "auto": {"used": "gradinversion", "tried": tried}}
    out = judge(evidence_from_metrics(metrics))
    assert out.verdict == LEAKED and "dlg: rebuilt: PSNR 23.9 dB" in out.reason
    # without ground truth nothing is scored: the attacker-side judgement stands
    assert judge(Evidence(converged=True, attack_line=0.4, others_leaked=())).verdict != LEAKED


def test_a_real_batch_scores_every_member_and_keeps_the_worst_case(tmp_path, capsys):
    """DLG's LeNet, batch 2, a short budget: every member runs, each is scored against the truth,
    and the run's verdict is the worst over them."""
    out = tmp_path / "auto"
    assert main(["attack", "--model", "lenet-dlg", "--batch-size", "2", "--iterations", "6", "--stall-restarts", "0",
                 *FAST, "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    ran = [t for t in m["auto"]["tried"] if t["applies"]]
    assert [t["attack"] for t in ran] == ["dlg", "gradinversion", "ig"], m["auto"]
    assert all(isinstance(t["psnr_mean"], float) for t in ran)
    assert all(isinstance(t.get("verdict"), str) for t in ran)   # the kept answer judged alone too
    assert m["settings"]["portfolio"][0]["iterations"] == 6
    assert m["verdict"] == (LEAKED if any(t.get("verdict") == LEAKED for t in ran) else m["verdict"])
    text = " ".join(capsys.readouterr().out.split())   # the console wraps where the timings' digits fall
    assert "auto: used" in text and "gradinversion (" in text and " dB" in text
    # every other member's answer is a picture of the run, shown in the report with its verdict
    html = (out / "report.html").read_text()
    for t in ran:
        if t["attack"] != m["attack"]:
            assert (out / f"reconstruction-{t['attack']}.png").is_file()
            assert f"auto also ran {t['attack']} on this update: {t['verdict']}" in html
    # the rerun flags: a constant every member that reads it holds at one value (--iterations 6), not a
    # member's own (lr)
    cfg = flat_config(json.loads((out / "config.json").read_text()))
    assert cfg["attack"] == "auto" and "fallback" not in cfg and cfg["iterations"] == 6 and "lr" not in cfg


def test_sigterm_inside_the_second_member_then_resume_gives_the_uninterrupted_run(tmp_path, capsys, monkeypatch):
    import gradleak.pipeline.image as image_case

    args = ["attack", "--model", "lenet-dlg", "--batch-size", "2", "--iterations", "8", "--stall-restarts", "0",
            "--log-every", "2", "--checkpoint-every", "2", *FAST]
    real = image_case.PSNRObserver.__call__
    seen = {"calls": 0}

    def call(self, iteration, images):
        real(self, iteration, images)
        seen["calls"] += 1   # observed at steps 2, 4, 6, 8 of each member in turn
        if seen["calls"] == 6:   # the second member (GradInversion), step 4
            assert iteration == 4
            signal.raise_signal(signal.SIGTERM)
    monkeypatch.setattr(image_case.PSNRObserver, "__call__", call)
    out = tmp_path / "run"
    assert main([*args, "--out", str(out)]) == 128 + signal.SIGTERM
    state = json.loads((state_dir_for(out) / "state.json").read_text())
    assert state["phase"].startswith("gradinversion/") and state["step"] == 4
    monkeypatch.setattr(image_case.PSNRObserver, "__call__", real)
    assert main(["attack", "--resume", str(out)]) == 0
    assert main([*args, "--out", str(tmp_path / "straight")]) == 0
    capsys.readouterr()

    def numbers(path):
        m = json.loads((path / "metrics.json").read_text())
        tried = [{k: v for k, v in t.items() if k != "seconds"} for t in m["auto"]["tried"]]
        return m["psnr_mean"], m["attack"], tried, m["verdict"]

    assert numbers(out) == numbers(tmp_path / "straight")
    assert (out / "history.csv").read_text() == (tmp_path / "straight" / "history.csv").read_text()
