"""One attack, one module: each attack declares itself once (its SPEC literal) and the names, the
flags, the --help defaults, the typed configs, the verdict lines, auto's candidates and the sweep's
changed defaults are derived from the declarations. Dropping a new module into attacks/ is all it
takes to add an attack (checked end to end on a copy of the package); the same for a defense, an
image model and an experiment, each one file."""

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gradleak
from gradleak import catalog, specs
from gradleak.attacks.configs import CLOSED_FORM, CONFIGS, FLAT_FIELDS, resolve_attack
from gradleak.config import AttackConfig
from gradleak.errors import ConfigError
from gradleak.outcome import CONVERGED_BELOW
from gradleak.sweep.spec import AUTO_PORTFOLIO, CHANGED_DEFAULTS


def test_each_declaration_read_without_import_is_the_module_s_own():
    """The literal specs.py reads from the source is the SPEC the imported module holds, and each
    module runs as run(config, update, model, engine); an image closed form also has its check."""
    for modality in ("image", "text"):
        for name, spec in specs.attack_specs(modality).items():
            module = importlib.import_module(spec.module)
            assert specs.make_spec(module.SPEC, spec.module) == spec, name
            assert spec.modality == modality and callable(module.run), name
            if spec.closed_form and modality == "image":
                assert callable(module.check), name


def test_every_attacks_run_takes_its_typed_config():
    """Issue 58: each of the 17 attacks' ``run`` is annotated with its own typed config class (the
    one attacks/configs.py or text/configs.py derives from its SPEC), never Any or object."""
    import inspect
    import typing

    from gradleak.text.configs import TEXT_ATTACK_CONFIGS

    classes = {"image": CONFIGS, "text": TEXT_ATTACK_CONFIGS}
    seen = 0
    for modality in ("image", "text"):
        for name, spec in specs.attack_specs(modality).items():
            module = importlib.import_module(spec.module)
            first = next(iter(inspect.signature(module.run).parameters))
            hints = typing.get_type_hints(module.run, vars(module))
            assert hints[first] is classes[modality][name], (modality, name, hints[first])
            seen += 1
    assert seen == 17


def test_text_attacks_derive_from_their_specs():
    """The text attacks' names, typed configs, per-model defaults, flags and verdict line come from
    their modules' SPECs (text/attacks/); a name may be an image attack's too (dlg)."""
    from gradleak.text.configs import TEXT_ATTACK_CONFIGS, TEXT_FLAT_FIELDS

    declared = specs.attack_specs("text")
    assert set(declared) == set(catalog.TEXT_ATTACKS) == set(TEXT_ATTACK_CONFIGS) == {"auto", "bow", "dager", "dlg", "dlg-free", "lamp", "tag"}
    assert declared["dlg"].module == "gradleak.text.attacks.dlg" and specs.attack_specs()["dlg"].module == \
        "gradleak.attacks.dlg"
    assert CONVERGED_BELOW["text"] == declared["dlg"].converged_below == 1e-4
    assert TEXT_FLAT_FIELDS == ("beam_width", "iterations", "lr", "optimizer", "dtype", "labels",
                                "search_evaluations", "lm_weight", "discrete_every", "discrete_candidates", "l1_weight")
    for flag in TEXT_FLAT_FIELDS:
        assert flag in AttackConfig.model_fields and flag in FLAT_FIELDS
    assert declared["dlg"].defaults_for("minilm")["iterations"] == 50
    assert declared["dlg"].defaults_for("a-model-of-mine") == declared["dlg"].defaults_for("tiny-transformer")
    with pytest.raises(ConfigError, match="model_defaults 'm' sets depth"):
        specs.make_spec({"name": "x", "modality": "text", "summary": "s", "kind": "optimisation",
                         "converged_below": 1e-4, "needs": "n", "flags": {"lr": None},
                         "model_defaults": {"m": {"depth": 2}}}, "x")
    with pytest.raises(ConfigError, match="modality 'audio'"):
        specs.make_spec({"name": "x", "modality": "audio", "summary": "s", "kind": "optimisation",
                         "converged_below": 1e-4, "needs": "n", "flags": {}}, "x")


def test_every_surface_derives_from_the_specs():
    declared = specs.attack_specs()
    assert set(catalog.IMAGE_ATTACKS) == set(declared) == set(CONFIGS)
    assert set(CONVERGED_BELOW) - {"text"} == {n for n, s in declared.items() if s.converged_below}
    assert CLOSED_FORM == ("imprint", "trap", "analytic", "cpa", "rgap")
    assert AUTO_PORTFOLIO == ("dlg", "gradinversion", "idlg", "ig")
    assert CHANGED_DEFAULTS[("ig", "iterations")] == "1000 since 2026-11-26 (4800 before)"  # hashed: word for word
    for name, spec in declared.items():
        for flag in spec.flags:
            assert flag in AttackConfig.model_fields, (name, flag)   # a CLI flag
            if spec.kind != "chooser":
                assert flag in CONFIGS[name].model_fields, (name, flag)
                assert flag in FLAT_FIELDS
    # each attack's typed defaults are its declared ones (GradInversion: its first preset's)
    for name in ("dlg", "idlg", "ig", "gradinversion"):
        cfg = resolve_attack({"attack": name, "seed": 0}, bn_statistics_shared=True)
        for flag, declared_flag in declared[name].flags.items():
            assert getattr(cfg, flag) == declared_flag.default, (name, flag)


def test_bad_declarations_are_refused_with_the_module_named():
    base = {"name": "x", "summary": "s", "kind": "optimisation", "converged_below": 0.1, "needs": "n", "flags": {}}
    specs.make_spec(base, "m")
    for bad, words in (({**base, "kind": "magic"}, "kind"), ({**base, "colour": 1}, "unknown keys colour"),
                       ({k: v for k, v in base.items() if k != "needs"}, "lacks needs"),
                       ({**base, "flags": {"depth": 3}}, "not a common one"),
                       ({**base, "flags": {"depth": ["int[0,x]", 3, "h"]}}, "unknown type"),
                       ({**base, "presets": {"p": {"depth": 1}}}, "not its flags")):
        with pytest.raises(ConfigError, match=words):
            specs.make_spec(bad, "pkg.module")


GREY = '''"""A test attack: mid-grey images at --level (the smallest module an attack can be)."""

from __future__ import annotations

SPEC = {
    "name": "grey",
    "summary": "every pixel at --level (a test of adding an attack)",
    "kind": "optimisation",
    "converged_below": 0.5,
    "needs": "nothing",
    "flags": {"level": ["float>=0", 0.25, "grey: the pixel value"]},
}

import torch

from .labels import restore_labels
from .reconstruction import Reconstruction


def run(config, update, model, engine):
    k = int(update.meta.batch_size)
    images = torch.full((k, *model.input_shape), float(config.level))
    return Reconstruction(images=images, labels=restore_labels(update, model, k, "gradinversion").cpu().long(),
                          history=[], iterations=0, wall_seconds=0.0, label_method="gradinversion",
                          extra={"relative_gradient_distance": 1.0, "plateau": False, "restarts_used": 0})
'''


@pytest.mark.slow
def test_dropping_a_module_into_attacks_adds_an_attack(tmp_path):
    """On a copy of the package with one new file in attacks/: `gradleak list` names it,
    `attack --help` shows its flag and default, another attack refuses its flag, and a run
    through the pipeline uses the flag and writes a judged run folder."""
    src = tmp_path / "src"
    shutil.copytree(Path(gradleak.__file__).parent, src / "gradleak",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (src / "gradleak" / "attacks" / "grey.py").write_text(GREY)
    env = {**os.environ, "PYTHONPATH": str(src)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gradleak.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    listed = cli("list")
    assert listed.returncode == 0 and "every pixel at --level" in listed.stdout
    helped = cli("attack", "--help")
    assert "--level" in helped.stdout and "grey: the pixel value (default: 0.25)" in " ".join(helped.stdout.split())
    refused = cli("attack", "--attack", "dlg", "--level", "0.3", "--no-progress")
    assert refused.returncode == 2 and "--level does not apply to attack 'dlg'" in refused.stderr
    out = tmp_path / "run"
    ran = cli("attack", "--attack", "grey", "--level", "0.3", "--no-progress", "--no-paper-metrics", "--threads", "1",
              "--out", str(out))
    assert ran.returncode in (0, 1), ran.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["attack"] == "grey" and metrics["verdict"] == "inconclusive"   # 1.0 is above its 0.5 line
    assert json.loads((out / "config.json").read_text())["attack"]["level"] == 0.3   # recorded with the run


ECHO = '''"""A text attack added by dropping this file into text/attacks/ (tests/attacks/test_specs.py)."""

SPEC = {
    "name": "echo",
    "modality": "text",
    "summary": "each sentence is the first leaked token, --copies times",
    "kind": "closed-form",
    "converged_below": None,
    "needs": "the word-embedding gradient",
    "flags": {"copies": ["int[1,8]", 2, "echo: how many times the token is repeated"]},
}

from ..leak import bow_attack


def run(config, update, model, engine):
    rec = bow_attack(update, model, engine.observer)
    tok = model.tokenizer
    rec.token_ids = [[tok.cls_id, *(row[1:2] * config.copies), tok.sep_id] for row in rec.token_ids]
    return rec
'''


@pytest.mark.slow
def test_dropping_a_module_into_text_attacks_adds_a_text_attack(tmp_path):
    """The same for text: one new file in text/attacks/ gives a text attack with its own flag that
    `gradleak list` names, `attack --help` shows, image attacks refuse, and a text run records."""
    pytest.importorskip("tokenizers")
    src = tmp_path / "src"
    shutil.copytree(Path(gradleak.__file__).parent, src / "gradleak",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (src / "gradleak" / "text" / "attacks" / "echo.py").write_text(ECHO)
    env = {**os.environ, "PYTHONPATH": str(src)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gradleak.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    listed = cli("list")
    text_attacks = listed.stdout.split("text attacks")[1].split("experiments:")[0]
    assert listed.returncode == 0 and "echo" in text_attacks and "the first leaked token, --copies times" in text_attacks
    assert "echo: how many times the token is repeated (default: 2)" in " ".join(cli("attack", "--help").stdout.split())
    refused = cli("attack", "--attack", "dlg", "--copies", "3", "--no-progress")
    assert refused.returncode == 2 and "--copies does not apply to attack 'dlg'" in refused.stderr
    refused = cli("attack", "--modality", "text", "--attack", "dlg", "--copies", "3", "--no-progress",
                  "--text", "the cat sat on the mat")
    assert refused.returncode == 2 and "--copies does not apply to text attack 'dlg'" in refused.stderr
    out = tmp_path / "run"
    ran = cli("attack", "--modality", "text", "--attack", "echo", "--copies", "3", "--text", "the cat sat on the mat",
              "--no-progress", "--threads", "1", "--out", str(out))
    assert ran.returncode in (0, 1), ran.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["attack"] == "echo" and len(metrics["recovered_sentences"][0].split()) == 3
    assert json.loads((out / "config.json").read_text())["attack"]["copies"] == 3   # recorded with the run


SCALE = '''
"""A defense added by dropping this file into defenses/ (tests/attacks/test_specs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Defense

SPEC = {"name": "scale", "class": "Scale", "summary": "multiply every gradient entry by a factor > 0",
        "positional": "factor", "parameters": {"factor": ["float", True, [0.0, False], None, []]},
        "example": "scale:0.5"}


@dataclass(frozen=True)
class Scale(Defense):
    factor: float
    name: ClassVar[str] = "scale"
    positional: ClassVar[str | None] = "factor"

    def transform(self, gradients, generator):
        return {k: g.detach() * self.factor for k, g in gradients.items()}
'''

ONE_LAYER = '''
"""An image model added by dropping this file into models/ (tests/attacks/test_specs.py)."""

SPEC = {"name": "one-layer", "summary": "one fully connected layer on the flattened image", "build": "build",
        "image_size": 16, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}


def build(num_classes, channels, image_size, **kw):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size * image_size, num_classes))
'''

SCALE_CHECK = '''
"""An experiment added by dropping this file into experiments/ (tests/attacks/test_specs.py)."""

from .base import ExperimentResult, experiment

SPEC = {"name": "scale-check", "summary": "the analytic attack on one-layer under the scale defense"}
FACTORS = (1.0, 0.25)


@experiment("scale-check")
def scale_check(opt, ws):
    plan = {f: dict(attack="analytic", model=opt.model or "one-layer", data="cifar10-samples", seed=opt.seed,
                    batch_size=1, defense=[f"scale:{f:g}"]) for f in FACTORS}
    cells = ws.run(plan)
    rows = [{"factor": f, "psnr": c.metrics["psnr_mean"], "verdict": c.metrics["verdict"]}
            for f, c in cells.items() if c.ok]
    return ExperimentResult(name="scale-check", title="analytic under scale", columns=["factor", "psnr", "verdict"],
                            rows=rows, setup={"model": opt.model or "one-layer", "factors": list(FACTORS)})
'''


@pytest.mark.slow
def test_dropping_a_defense_a_model_and_an_experiment_adds_them(tmp_path):
    """On a copy of the package with three new files (defenses/scale.py, models/one_layer.py,
    experiments/scale_check.py) and no other edit: `gradleak list` names each, a misspelt name of
    each gets its "did you mean", the defense's parameter is checked from its declaration, a
    shared update is the clean one times the factor, and the experiment runs the analytic attack
    on the new model under the new defense (x = dW_i / db_i is blind to the factor: every image
    rebuilt)."""
    from safetensors.torch import load_file

    src = tmp_path / "src"
    shutil.copytree(Path(gradleak.__file__).parent, src / "gradleak",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder, name, text in (("defenses", "scale.py", SCALE), ("models", "one_layer.py", ONE_LAYER),
                               ("experiments", "scale_check.py", SCALE_CHECK)):
        (src / "gradleak" / folder / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(src)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gradleak.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    listed = cli("list").stdout
    for section, end, line in (("models:", "data sources", "one-layer "), ("defenses", "servers", "scale "),
                               ("experiments:", None, "scale-check ")):
        part = listed.split(section)[1]
        part = part.split(end)[0] if end else part
        assert line in part, (section, listed)
    for argv, hint in ((["attack", "--defense", "scal:0.5"], "did you mean 'scale'"),
                       (["attack", "--model", "one-layr"], "did you mean 'one-layer'"),
                       (["experiment", "scale-chek", "--out", str(tmp_path / "never")], "did you mean 'scale-check'"),
                       (["attack", "--defense", "scale:0"], "factor must be a finite number > 0")):
        refused = cli(*argv, "--no-progress")
        assert refused.returncode == 2 and hint in refused.stderr, (argv, refused.stderr)
    clean, scaled = tmp_path / "clean.safetensors", tmp_path / "scaled.safetensors"
    for out, extra in ((clean, []), (scaled, ["--defense", "scale:0.25"])):
        shared = cli("share", "--model", "one-layer", "--data", "cifar10-samples", "--batch-size", "1", *extra,
                     "--out", str(out))
        assert shared.returncode == 0, shared.stderr
    a, b = load_file(str(clean)), load_file(str(scaled))
    grads = [k for k in a if k.startswith("grad/")]
    assert grads == ["grad/1.bias", "grad/1.weight"] and all(bool((b[k] == a[k] * 0.25).all()) for k in grads)
    ran = cli("experiment", "scale-check", "--out", str(tmp_path / "exp"), "--threads", "1", "--executor", "inline",
              "--no-progress")
    assert ran.returncode == 0, ran.stderr
    rows = json.loads((tmp_path / "exp" / "experiment.json").read_text())["rows"]
    assert [r["factor"] for r in rows] == [1.0, 0.25]
    assert all(r["psnr_oracle_pairing"] >= 60 and r["verdict"] == "leaked" for r in rows), rows


def test_modalities_and_servers_declare_themselves_in_their_own_modules():
    """Issue 58: each modality's MODALITY_SPEC (pipeline/<name>.py) and each server's SERVER_SPEC
    (models/) is read without importing its module, is the literal the module holds, and the
    callables it names (share, report, summary_lines; a server's build) are that module's."""
    from gradleak.modalities import MODALITIES, modality_named

    declared = specs.declarations("modality")
    assert list(declared) == list(MODALITIES) == ["image", "text"]
    assert declared["image"].module == "gradleak.pipeline.image" and declared["text"].module == "gradleak.pipeline.text"
    for name, decl in declared.items():
        module = importlib.import_module(decl.module)
        assert module.MODALITY_SPEC == decl.values and modality_named(name).plugin == decl.module
        for key in ("share", "report", "summary_lines"):
            assert decl.get(key) is None or callable(getattr(module, decl.get(key))), (name, key)
    assert modality_named("text").summary_lines({"recovered_sentences": ["a b"]}) == ["  recovered: a b"]
    for name, decl in specs.declarations("server").items():
        assert decl.get("build") is None or callable(getattr(importlib.import_module(decl.module), decl.get("build")))
    assert specs.declarations("server")["honest"].get("build") is None
    base = {"name": "x", "summary": "s", "share": "share", "report": "report", "attack_kind": "attack",
            "model_kind": "model", "files": "f.png", "summary_keys": [], "measures": "images", "nothing": "n"}
    specs.make_declaration("modality", base, "m")
    for bad in ({**base, "measures": "sounds"}, {**base, "share": "pkg.mod:share"}, {**base, "refuses": {"a": "b"}}):
        with pytest.raises(ConfigError, match="modality 'x' needs share"):
            specs.make_declaration("modality", bad, "m")
    with pytest.raises(ConfigError, match="exclusive must list"):
        specs.make_declaration("server", {"name": "x", "summary": "s", "parameters": ["a"],
                                          "exclusive": [["a", "b", "why"]]}, "m")


DAMPED = '''
"""A malicious server added by dropping this file into models/ (tests/attacks/test_specs.py)."""

SERVER_SPEC = {"name": "damped", "summary": "every weight of the global model times a factor", "parameters": ["factor"],
               "example": "damped:factor=0.5", "build": "damped_server"}


def damped_server(spec, *, factor=None):
    import copy
    from dataclasses import replace

    import torch

    f = 0.5 if factor is None else factor
    module = copy.deepcopy(spec.module)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(f)
    return replace(spec, module=module, kwargs={**spec.kwargs, "server": f"damped:factor={f!r}"})
'''

AUDIO = '''
"""A modality declared by dropping this file into pipeline/ (tests/attacks/test_specs.py)."""

MODALITY_SPEC = {"name": "audio", "summary": "sounds", "share": "share_audio", "report": "audio_report",
                 "attack_kind": "attack", "model_kind": "model", "files": "reconstruction.wav",
                 "summary_keys": ["snr"], "measures": "images", "nothing": "rebuilt no sound"}
'''

SERVER_CHECK = '''
import json, sys
import torch
from gradleak import specs
from gradleak.fl import read_update_meta
from gradleak.modalities import modality_named, recorded_modality
from gradleak.models import build_model
from gradleak.server_spec import parse_server

clean = build_model("lenet-dlg", num_classes=10, seed=0)
damped = build_model("lenet-dlg", num_classes=10, seed=0, server="damped:0.25")
same = all(bool((b == a * 0.25).all()) for a, b in zip(clean.module.parameters(), damped.module.parameters()))
audio = modality_named("audio")
print(json.dumps({"parsed": parse_server("damped:0.25").factor, "scaled": same, "server": damped.kwargs["server"],
                  "file": read_update_meta(sys.argv[1]).model_kwargs.get("server"),
                  "audio": [audio.plugin, audio.share, specs.declarations("modality")["audio"].module],
                  "default": recorded_modality(None).name}))
'''


@pytest.mark.slow
def test_dropping_a_server_and_a_modality_declaration_adds_them(tmp_path):
    """On a copy of the package with models/damped.py (a malicious server: its SERVER_SPEC and
    builder, nothing else) and pipeline/audio.py (a modality's declaration) and no other edit:
    `gradleak list` names the server, a misspelt one gets its "did you mean", its parameter is
    parsed from its declaration, `share --server damped:0.25` builds the damped model and records
    it in the update file, and the modality is found from its own module (image stays the default)."""
    src = tmp_path / "src"
    shutil.copytree(Path(gradleak.__file__).parent, src / "gradleak", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "gradleak" / "models" / "damped.py").write_text(DAMPED)
    (src / "gradleak" / "pipeline" / "audio.py").write_text(AUDIO)
    env = {**os.environ, "PYTHONPATH": str(src)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "gradleak.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    listed = cli("list").stdout
    assert "damped " in listed.split("servers")[1].split("text models")[0], listed
    assert "damped[:factor=X]" in " ".join(cli("attack", "--help").stdout.split())
    for argv, hint in ((["--server", "dampd"], "did you mean 'damped'"),
                       (["--server", "damped:factor=x"], "server damped: factor must be a number, got 'x'"),
                       (["--server", "damped:gain=1"], "unknown or repeated parameter 'gain' (factor)")):
        refused = cli("attack", *argv, "--no-progress")
        assert refused.returncode == 2 and hint in refused.stderr, (argv, refused.stderr)
    update = tmp_path / "damped.safetensors"
    shared = cli("share", "--model", "lenet-dlg", "--data", "cifar10-samples", "--batch-size", "1", "--server",
                 "damped:0.25", "--out", str(update))
    assert shared.returncode == 0, shared.stderr
    done = subprocess.run([sys.executable, "-c", SERVER_CHECK, str(update)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"parsed": 0.25, "scaled": True, "server": "damped:factor=0.25",
                                       "file": "damped:factor=0.25", "default": "image",
                                       "audio": ["gradleak.pipeline.audio", "gradleak.pipeline.audio:share_audio",
                                                 "gradleak.pipeline.audio"]}
