"""The one pipeline (issue 16): typed attack configs, the engine, text through every entry point,
--indices, and the case deciding what the client shares."""

import json
import signal
import sys
from dataclasses import dataclass, field

import pytest
import torch

from gradleak.attacks import AttackState, resolve_attack
from gradleak.attacks.configs import CONFIGS
from gradleak.attacks.gradinversion import settings_record
from gradleak.engine.checkpoints import state_dir_for
from gradleak.cli import main
from gradleak.config import make_config
from gradleak.errors import ConfigError
from gradleak.pipeline import build_case, run

TEXT = ["attack", "--modality", "text", "--attack", "dlg", "--text", "gradients leak every word", "--no-progress",
        "--threads", "1", "--iterations", "30", "--log-every", "5"]


def _metrics(path):
    m = json.loads((path / "metrics.json").read_text())
    for k in ("wall_seconds", "search_seconds", "resumed_at", "seconds_per_iteration"):
        m.pop(k, None)
    return m


def _sigterm_at(monkeypatch, cls, n):
    """Make the observer class ``cls`` raise SIGTERM once it has seen iteration ``n``; returns its
    real ``__call__`` (to put back before resuming)."""
    real = cls.__call__

    def call(self, iteration, answer):
        real(self, iteration, answer)
        if iteration == n:
            signal.raise_signal(signal.SIGTERM)
    monkeypatch.setattr(cls, "__call__", call)
    return real


def test_text_sigterm_then_resume_gives_the_uninterrupted_run(tmp_path, capsys, monkeypatch):
    import gradleak.pipeline.text as text_case

    out = tmp_path / "run"
    real = _sigterm_at(monkeypatch, text_case.TokenAccuracyObserver, 15)
    assert main([*TEXT, "--checkpoint-every", "10", "--out", str(out)]) == 128 + signal.SIGTERM
    state = state_dir_for(out)
    assert not out.exists() and json.loads((state / "state.json").read_text())["step"] == 15
    monkeypatch.setattr(text_case.TokenAccuracyObserver, "__call__", real)
    assert main(["attack", "--resume", str(out)]) == 0
    assert not state.exists()
    assert main([*TEXT, "--out", str(tmp_path / "straight")]) == 0
    capsys.readouterr()
    a, b = _metrics(out), _metrics(tmp_path / "straight")
    assert a == b and a["status"] == "finished"
    assert json.loads((out / "metrics.json").read_text())["resumed_at"] == [{"phase": "main", "iteration": 15}]
    for name in ("history.csv", "reconstruction.json"):
        assert (out / name).read_text() == (tmp_path / "straight" / name).read_text()


def test_text_config_records_the_resolved_attack_and_reruns(tmp_path, capsys):
    assert main([*TEXT, "--out", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())["attack"]   # the typed config that ran
    settings = json.loads((tmp_path / "a" / "metrics.json").read_text())["settings"]
    # every field the text attack read is resolved and recorded (the model's defaults filled in)
    assert (cfg["iterations"], cfg["lr"], cfg["optimizer"], cfg["dtype"], cfg["labels"]) == (30, 0.1, "adam",
                                                                                           "float64", "bias")
    assert cfg["search_evaluations"] == settings["search_evaluations"] == 4000
    assert main(["attack", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")


def test_text_cells_run_in_a_sweep(tmp_path):
    from gradleak.sweep import parse_spec, run_sweep

    spec = parse_spec({"base": {"modality": "text", "text": ["gradients leak every word"], "threads": 1},
                       "grid": {"attack": ["bow", "dlg"]}})
    summary = run_sweep(spec, tmp_path / "sw", executor="inline", progress=False)
    assert len(summary.computed) == 2 and not summary.failed
    import csv

    rows = {r["attack"]: r for r in csv.DictReader(open(tmp_path / "sw" / "results.csv"))}
    assert float(rows["bow"]["token_set_recall"]) == 1.0 and float(rows["dlg"]["token_accuracy"]) == 1.0


def test_typed_configs_resolve_every_constant_and_refuse_what_an_attack_ignores():
    gi = resolve_attack(make_config(attack="gradinversion", iterations=60, seeds=2, alpha_tv=0.5).model_dump(),
                        bn_statistics_shared=True)
    assert isinstance(gi, CONFIGS["gradinversion"])
    # the cpu preset, then --iterations (schedule rescaled, warm-up capped), then the constants given
    assert (gi.iterations, gi.registration_start, gi.registration_every, gi.warmup) == (60, 15, 1, 6)
    assert (gi.alpha_tv, gi.alpha_bn, gi.seeds, gi.bn) == (0.5, 1.0, 2, "exact")
    assert settings_record(gi)["alpha_tv"] == 0.5 and settings_record(gi)["name"] == "cpu"  # what the run records
    ig = resolve_attack(make_config(attack="ig", alpha_tv=0.2).model_dump(), bn_statistics_shared=False)
    assert isinstance(ig, CONFIGS["ig"]) and ig.alpha_tv == 0.2 and ig.iterations == 1000
    # IG's default alpha_TV per layer (ig.ig_alpha_tv): the authors' 0.1 up to the convnet's 14
    # parameter tensors, scaled by tensors / 14 above; a value given is kept
    for layers, expected in (((8, 0), 0.1), ((14, 4), 0.1), ((62, 20), 0.1 * 62 / 14), (None, 0.1)):
        resolved = resolve_attack({"attack": "ig", "seed": 0}, bn_statistics_shared=False, layers=layers)
        assert resolved.alpha_tv == pytest.approx(expected), layers
    assert resolve_attack({"attack": "ig", "seed": 0, "alpha_tv": 0.05}, bn_statistics_shared=False,
                          layers=(62, 20)).alpha_tv == 0.05
    from gradleak.pipeline import build_case

    case = build_case(make_config(attack="ig", model="resnet18-cifar", iterations=0, progress=False))
    assert case.attack_config(make_config(attack="ig", model="resnet18-cifar")).alpha_tv == pytest.approx(0.1 * 62 / 14)
    for attack, flag in (("dlg", "alpha_tv"), ("idlg", "seeds"), ("ig", "alpha_bn"), ("dlg", "search_evaluations")):
        with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} does not apply"):
            resolve_attack(make_config(attack=attack, **{flag: 1}).model_dump(), bn_statistics_shared=False)


def test_the_case_decides_what_the_client_shares(tmp_path, capsys):
    base = dict(attack="gradinversion", model="convnet", width=4, batch_size=1, iterations=0, seeds=1,
                progress=False, paper_metrics=False)
    case = build_case(make_config(**base))
    assert not case.update.meta.bn_statistics_shared and case.attack_config(make_config(**base)).bn == "approx"
    shared = make_config(**base, share_bn_statistics=True)
    assert build_case(shared).attack_config(shared).bn == "exact"
    with pytest.raises(ConfigError, match="--bn exact needs an update"):
        case.attack_config(make_config(**base, bn="exact"))
    # the attack never changes the client: DLG on the same config shares the same update
    a = build_case(make_config(**{**base, "attack": "dlg"})).update.gradients
    b = case.update.gradients
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_indices_attack_those_items(tmp_path):
    cfg = make_config(attack="idlg", indices=[5, 2], batch_size=2, iterations=1, progress=False, paper_metrics=False)
    case = build_case(cfg)
    from gradleak.data import open_source

    source = open_source("cifar10-samples")
    assert case.truth.labels.tolist() == [source.label(5), source.label(2)]
    assert case.truth.names == (source.item_name(5), source.item_name(2))
    with pytest.raises(ConfigError, match="--indices names 1 items"):
        build_case(make_config(indices=[1], batch_size=2))
    with pytest.raises(ConfigError, match="past the end"):
        build_case(make_config(indices=[10_000]))


@dataclass
class _Toy(AttackState):
    x: torch.Tensor
    best: float | None = None
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(1))
    shape: tuple = field(default=(2,), metadata={"state": False})


def test_attack_state_round_trip_and_checks():
    a = _Toy(x=torch.arange(2.0), best=0.5)
    a.gen.manual_seed(7)
    saved = a.get_state()
    assert set(saved) == {"x", "best", "gen"}           # the run-describing field is not saved
    b = _Toy(x=torch.zeros(2, dtype=torch.float64))
    b.set_state(saved)
    assert torch.equal(b.x, torch.arange(2.0, dtype=torch.float64)) and b.x.dtype == torch.float64 and b.best == 0.5
    assert torch.equal(b.gen.get_state(), a.gen.get_state())
    for bad, match in (({**saved, "x": torch.zeros(3)}, "shape"), ({**saved, "best": "x"}, "best"),
                       ({k: v for k, v in saved.items() if k != "gen"}, "lacks 'gen'")):
        with pytest.raises(ValueError, match=match):
            _Toy(x=torch.zeros(2)).set_state(bad)


def test_run_is_the_one_entry_for_image_and_text(tmp_path):
    r = run(make_config(modality="text", attack="bow", text=["a secret"], progress=False), write=False)
    assert r.metrics["modality"] == "text" and r.metrics["token_set_recall"] == 1.0 and r.run_dir is None
    r = run(make_config(attack="idlg", iterations=2, progress=False, paper_metrics=False), write=False)
    assert r.metrics["label_accuracy"] == 1.0 and r.metrics["settings"]["attack"] == "idlg"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


@pytest.mark.parametrize("flags,match", [({"local_steps": 3}, "--local-steps applies to --threat fedavg"),
                                         ({"clients": 3}, "--clients applies to --threat aggregate"),
                                         ({"inner": "fedavg"}, "--inner applies to --threat aggregate"),
                                         ({"threat": "fedavg", "clients": 2}, "--clients applies"),
                                         ({"threat": "aggregate", "clients": 2, "local_lr": 0.5},
                                          "--local-lr applies")])
def test_threat_flags_for_another_threat_are_errors(flags, match):
    with pytest.raises(ConfigError, match=match):
        build_case(make_config(iterations=1, **flags))


def test_every_typed_field_is_a_flag():
    """Every field of every attack's typed config can be given on the command line."""
    from gradleak.attacks.configs import IMAGE_ATTACK_CONFIGS
    from gradleak.config import AttackConfig
    from gradleak.text.configs import TEXT_ATTACK_CONFIGS

    for cls in [*IMAGE_ATTACK_CONFIGS.values(), *TEXT_ATTACK_CONFIGS.values()]:
        # auto's portfolio is chosen by the case (auto.auto_portfolio); --fallback narrows it to one
        missing = set(cls.model_fields) - set(AttackConfig.model_fields) - {"attack", "portfolio"}
        assert not missing, (cls.__name__, missing)
    dlg = resolve_attack(make_config(attack="dlg", stall_restarts=0).model_dump(), bn_statistics_shared=False)
    assert dlg.stall_restarts == 0


def test_case_flags_a_source_or_model_would_ignore_are_errors():
    from gradleak.errors import GradleakError

    with pytest.raises(ConfigError, match="--split test applies to Fashion-MNIST"):
        build_case(make_config(split="test", iterations=1))
    with pytest.raises(GradleakError, match="--width applies to models with a width"):
        build_case(make_config(width=8, iterations=1))
    assert build_case(make_config(model="convnet", width=4, iterations=1)).model.kwargs["width"] == 4


def test_an_experiment_workspace_runs_text_cells(tmp_path):
    from gradleak.experiments import make_options
    from gradleak.experiments.cells import Workspace

    opts = make_options(out=str(tmp_path / "exp"), progress=False, executor="inline")
    ws = Workspace("text-demo", opts, (tmp_path / "exp").absolute(), tmp_path / "stage")
    (tmp_path / "exp").mkdir()
    cells = {"bow": {"modality": "text", "attack": "bow", "text": ["the code is 1234"]},
             "dlg": {"modality": "text", "attack": "dlg", "text": ["the code is 1234"], "iterations": 20}}
    got = ws.run(cells, run_folders=["dlg"])
    assert all(c.ok for c in got.values()) and ws.report.computed == 2
    assert got["bow"].metrics["token_set_recall"] == 1.0
    assert (got["dlg"].run_dir / "reconstruction.json").is_file()
    again = Workspace("text-demo", opts, (tmp_path / "exp").absolute(), tmp_path / "stage")
    assert again.run(cells, run_folders=["dlg"])["dlg"].metrics == got["dlg"].metrics and again.report.computed == 0


def test_resume_of_an_update_run_and_of_a_two_sentence_text_run(tmp_path, capsys, monkeypatch):
    """A resumed run tells a given flag from a default as the first run did (review of issue 16)."""
    import gradleak.pipeline.image as image_case
    import gradleak.pipeline.text as text_case

    u, t = tmp_path / "u.safetensors", tmp_path / "t.safetensors"
    assert main(["share", "--model", "convnet", "--width", "8", "--threat", "fedavg", "--local-steps", "2",
                 "--out", str(u), "--truth", str(t)]) == 0
    real = _sigterm_at(monkeypatch, image_case.PSNRObserver, 10)
    out = tmp_path / "img"
    args = ["attack", "--update", str(u), "--truth", str(t), "--attack", "ig", "--iterations", "20", "--log-every", "5",
            "--checkpoint-every", "5", "--no-progress", "--threads", "1", "--no-paper-metrics", "--out", str(out)]
    assert main(args) == 128 + signal.SIGTERM
    monkeypatch.setattr(image_case.PSNRObserver, "__call__", real)
    assert main(["attack", "--resume", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["model"] == "convnet"

    real = _sigterm_at(monkeypatch, text_case.TokenAccuracyObserver, 10)
    out = tmp_path / "txt"
    targs = ["attack", "--modality", "text", "--text", "the cat sat on the mat", "--text", "a dog ran home",
             "--iterations", "20", "--log-every", "5", "--checkpoint-every", "5", "--no-progress", "--threads", "1",
             "--out", str(out)]
    assert main(targs) == 128 + signal.SIGTERM
    monkeypatch.setattr(text_case.TokenAccuracyObserver, "__call__", real)
    assert main(["attack", "--resume", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["batch_size"] == 2
    capsys.readouterr()


def test_cells_and_update_files_decide_like_the_cli(tmp_path, capsys):
    from gradleak.sweep.worker import run_cell

    two = {**make_config(modality="text", attack="bow", text=["one secret", "two secrets"]).model_dump(mode="json")}
    res = run_cell(two)
    assert res["status"] == "ok" and res["metrics"]["batch_size"] == 2       # both sentences, as on the CLI
    u = tmp_path / "u.safetensors"
    assert main(["share", "--model", "convnet", "--width", "8", "--out", str(u)]) == 0
    res = run_cell({**make_config(attack="idlg", iterations=1, update=str(u)).model_dump(mode="json")})
    assert res["status"] == "ok" and res["metrics"]["model"] == "convnet"
    assert res["metrics"]["data"] == "unknown (update file)"
    code = main(["attack", "--update", str(u), "--data", "fashion-mnist", "--iterations", "1", "--out",
                 str(tmp_path / "x")])
    assert code == 2 and "does not apply to an update file without --truth" in capsys.readouterr().err
    tu = tmp_path / "tu.safetensors"
    assert main(["share", "--modality", "text", "--text", "hello there", "--threat", "fedavg", "--local-steps", "2",
                 "--out", str(tu)]) == 0
    for bad in (["--threat", "fedsgd"], ["--local-steps", "3"], ["--model-seed", "3"]):
        code = main(["attack", "--modality", "text", "--update", str(tu), *bad, "--out", str(tmp_path / "y")])
        assert code == 2 and not (tmp_path / "y").exists()
    capsys.readouterr()
    with pytest.raises(ConfigError, match="--allow-repeats applies to a draw"):
        build_case(make_config(indices=[1], allow_repeats=True))


def test_run_service_flags_that_would_be_ignored_are_errors(tmp_path, capsys):
    code = main(["attack", "--modality", "text", "--attack", "bow", "--text", "a b", "--log-every", "3",
                 "--out", str(tmp_path / "b")])
    assert code == 2 and "--log-every does not apply to text attack 'bow'" in capsys.readouterr().err
    code = main(["attack", "--attack", "gradinversion", "--nproc", "2", "--seeds", "2", "--checkpoint-every", "5",
                 "--out", str(tmp_path / "n")])
    assert code == 2 and "--checkpoint-every does not apply to a run over several" in capsys.readouterr().err
    code = main(["experiment", "label-restoration", "--smoke", "--workers", "2", "--out", str(tmp_path / "e")])
    assert code == 2 and "--workers does not apply to label-restoration" in capsys.readouterr().err
    assert not (tmp_path / "e").exists() and not (tmp_path / "b").exists() and not (tmp_path / "n").exists()


def test_a_state_saved_before_the_default_became_auto_resumes_as_dlg(tmp_path, capsys, monkeypatch):
    """A saved state whose config leaves out the attack (written while DLG was the default, before
    2026-11-26) resumes as the DLG run it was, not as the auto attack of today's default."""
    import gradleak.pipeline.image as image_case

    real = _sigterm_at(monkeypatch, image_case.PSNRObserver, 10)
    out = tmp_path / "run"
    args = ["attack", "--attack", "dlg", "--iterations", "20", "--log-every", "5", "--checkpoint-every", "5",
            "--no-progress", "--threads", "1", "--no-paper-metrics", "--out", str(out)]
    assert main(args) == 128 + signal.SIGTERM
    saved = state_dir_for(out) / "config.json"
    values = json.loads(saved.read_text())
    assert values.pop("attack") == "dlg"
    saved.write_text(json.dumps(values))  # as a state of before 2026-11-26 was written
    monkeypatch.setattr(image_case.PSNRObserver, "__call__", real)
    assert main(["attack", "--resume", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["attack"] == "dlg" and metrics["resumed_at"] == [{"phase": "trial-0", "iteration": 10}]
    capsys.readouterr()


def test_zero_image_scores_are_the_flat_mean_image_against_each_photo():
    """metrics.json's zero_psnr: the model's zero image (its normalisation mean, a flat image) scored
    against each true image, computed here by hand; above_zero_image counts the rows above it."""
    from gradleak.pipeline.image import simulate_client

    case = simulate_client(make_config(model="efficientnet-lite0", data="imagenet-samples", batch_size=2,
                                       image_size=32, threads=1, progress=False))
    truth = case.truth.images.double()
    mean = torch.tensor(case.model.mean, dtype=torch.float64).view(1, -1, 1, 1)
    want = 10 * torch.log10(1 / (truth - mean).pow(2).mean((1, 2, 3)))
    rows = [{"index": 0, "psnr": float(want[0]) + 0.01}, {"index": 1, "psnr": float(want[1]) - 0.01}]
    out = case.zero_image_scores(rows)
    assert [r["zero_psnr"] for r in rows] == pytest.approx(want.tolist(), abs=1e-4)
    assert out["zero_psnr_mean"] == pytest.approx(float(want.mean()), abs=1e-4)
    assert out["above_zero_image"] == 1
