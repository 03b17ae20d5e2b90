"""The torch-free catalog of names: equal to the registries it stands for, and the CLI answers a
mistake from it before torch is imported (issue 43: every bad-input error took 4.2-4.9 s)."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

import gradleak
from gradleak import catalog, specs


def gradleak_parse(text):
    from gradleak.server_spec import parse_server

    return parse_server(text)



def _declared_in(folder: str) -> tuple[str, ...]:
    """The names the SPEC literals of the modules in gradleak/FOLDER declare, sorted (read
    independently of specs.attack_specs: each file's top-level SPEC)."""
    root = Path(gradleak.__file__).parent / folder
    names = (specs.read_literal(path, "SPEC") for path in sorted(root.glob("*.py")))
    return tuple(sorted(spec["name"] for spec in names if isinstance(spec, dict)))

def test_catalog_equals_the_registries():
    import dataclasses
    import importlib

    from gradleak.attacks import attack_names
    from gradleak.attacks.configs import CONFIGS
    from gradleak.data import SOURCE_NAMES
    from gradleak.defenses import DEFENSES, defense_names
    from gradleak.experiments.base import ACCEPTS, EXPERIMENTS, experiment_names
    from gradleak.models import default_image_size, describe_models
    from gradleak.models.registry import normalisation
    from gradleak.models.server import SERVERS
    from gradleak.attacks.gradinversion import PRESETS
    from gradleak.text.configs import TEXT_ATTACK_CONFIGS
    from gradleak.text.models import TEXT_MODELS

    assert describe_models() == dict(sorted(catalog.MODELS.items()))
    for name, declared in specs.declarations("model").items():  # each declaration names its module's builder
        assert callable(getattr(importlib.import_module(declared.module), declared.get("build")))
        assert default_image_size(name) == declared.get("image_size")
        assert normalisation(name) == (tuple(declared.get("mean")), tuple(declared.get("std")))
    from gradleak.models.pretrained import LITE_MEAN, LITE_STD
    assert normalisation("efficientnet-lite0") == (LITE_MEAN, LITE_STD)
    assert tuple(SOURCE_NAMES) == catalog.SOURCES
    assert tuple(attack_names()) == tuple(catalog.IMAGE_ATTACKS)
    # every module under attacks/ with a SPEC is one attack, and none of today's is lost (a new attack
    # is one file: this list is a floor, not the catalog)
    assert tuple(catalog.IMAGE_ATTACKS) == _declared_in("attacks")
    assert set(catalog.IMAGE_ATTACKS) >= {"analytic", "auto", "cpa", "dlg", "gradinversion", "idlg", "ig", "imprint",
                                          "rgap", "trap"}
    for name, summary in catalog.IMAGE_ATTACKS.items():  # what the catalog read is what each module declares
        module = importlib.import_module(CONFIGS[name].spec.module)
        assert module.SPEC["name"] == name and module.SPEC["summary"] == summary and callable(module.run)
    assert tuple(defense_names()) == catalog.DEFENSES
    for name, declared in specs.declarations("defense").items():  # each declaration is its class's
        cls = DEFENSES[name]
        assert cls.__module__ == declared.module and cls.name == name and cls.positional == declared.get("positional")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert list(fields) == list(declared.get("parameters"))
        for field, (kind, required, *_) in declared.get("parameters").items():
            assert (fields[field].default is dataclasses.MISSING) == required and fields[field].type == kind
    assert tuple(SERVERS) == catalog.SERVERS == ("honest", "imprint", "trap")
    from gradleak.server_spec import INTEGER_PARAMETERS, PARAMETERS, ServerSpec
    for name, declared in specs.declarations("server").items():  # each module's SERVER_SPEC, the parser's keys
        assert importlib.import_module(declared.module).SERVER_SPEC == declared.values
        assert PARAMETERS.get(name, ()) == tuple(declared.get("parameters", ()))   # derived from the declarations
        # the parsed spec carries each declared parameter (ServerSpec.params; spec.bins reads one)
        assert all(getattr(ServerSpec(name), p) is None for p in declared.get("parameters", ()))
        assert declared.get("build") is None or callable(getattr(importlib.import_module(declared.module),
                                                                 declared.get("build")))
        assert set(declared.get("integers", ())) == INTEGER_PARAMETERS & set(PARAMETERS.get(name, ()))
        assert catalog.check("server", name) == name and gradleak_parse(declared.get("example")).name == name
    assert specs.declarations("server")["imprint"].module == "gradleak.models.imprint"
    assert tuple(sorted(PRESETS)) == catalog.PRESETS
    assert tuple(catalog.TEXT_ATTACKS) == tuple(TEXT_ATTACK_CONFIGS) == _declared_in("text/attacks")
    assert set(catalog.TEXT_ATTACKS) >= {"auto", "bow", "dager", "dlg", "dlg-free", "lamp", "tag"}
    for name, summary in catalog.TEXT_ATTACKS.items():  # text attacks declare themselves the same way
        module = importlib.import_module(TEXT_ATTACK_CONFIGS[name].spec.module)
        assert module.SPEC["name"] == name and module.SPEC["summary"] == summary and callable(module.run)
    assert TEXT_MODELS == catalog.TEXT_MODELS
    from gradleak.text.models import describe_text_models, text_model_names
    assert describe_text_models() == catalog.TEXT_MODELS and text_model_names() == ["tiny-transformer", "minilm"]
    for name, declared in specs.declarations("text model").items():  # the builder each declaration names
        assert declared.module == "gradleak.text.models"
        assert callable(getattr(importlib.import_module(declared.module), declared.get("build")))
    assert experiment_names() == sorted(catalog.EXPERIMENTS)
    assert {k: v[1] for k, v in EXPERIMENTS.items()} == catalog.EXPERIMENTS
    for name, declared in specs.declarations("experiment").items():  # the declaration is the registering module's
        assert EXPERIMENTS[name][0].__module__ == declared.module
        assert importlib.import_module(declared.module).SPEC == declared.values
        assert ACCEPTS[name] == frozenset(declared.get("accepts", ()))
    assert catalog.TEXT_EXPERIMENTS == {"text-batch-size"}


@pytest.mark.parametrize("name, known, hint", [
    ("dlgg", catalog.IMAGE_ATTACKS, "'dlg'"),
    ("lenet", catalog.MODELS, "'lenet-dlg'"),
    ("cifar", catalog.SOURCES, "'cifar10-samples' or 'cifar100-samples'"),
    ("gausian", catalog.DEFENSES, "'gaussian'"),
    ("zzzz", catalog.DEFENSES, None),
])
def test_did_you_mean(name, known, hint):
    text = catalog.did_you_mean(name, known)
    assert text == (f" (did you mean {hint}?)" if hint else "")


def test_unknown_cuts_a_hostile_name():
    err = catalog.unknown("model", "x" * 1_000_000, catalog.MODELS)
    assert len(str(err)) < 400 and "lenet-dlg" in str(err)


# Each: argv, a word the one error line must hold.
MISTAKES = [
    (["attack", "--attack", "dlgg"], "did you mean 'dlg'"),
    (["attack", "--model", "lenet"], "did you mean 'lenet-dlg'"),
    (["attack", "--data", "cifar10"], "did you mean 'cifar10-samples'"),
    (["attack", "--defense", "gausian:0.1"], "did you mean 'gaussian'"),
    (["attack", "--preset", "papr"], "did you mean 'paper'"),
    (["attack", "--update", "/nonexistent/u.safetensors"], "does not exist"),
    (["attack", "--modality", "text", "--attack", "dlg-fre"], "did you mean 'dlg-free'"),
    (["share", "--model", "convnt", "--out", "/tmp/never-written.safetensors"], "did you mean 'convnet'"),
    (["experiment", "batch-sise", "--out", "/tmp/never-written"], "did you mean 'batch-size'"),
    (["experiment", "batch-size", "--model", "lenet", "--out", "/tmp/never-written"], "did you mean 'lenet-dlg'"),
    (["experiment", "batch-size", "--attacks", "dlg,idgl", "--out", "/tmp/never-written"], "did you mean 'idlg'"),
    (["train", "--model", "resnet", "--out", "/tmp/never-written"], "did you mean"),
    (["train", "--defense", "prun:0.5", "--out", "/tmp/never-written"], "did you mean 'prune'"),
    (["report", "/nonexistent/never-written-run"], "does not exist"),
    (["dashboard", "/nonexistent/never-written-sweep"], "does not exist"),
    (["audit-flower", "--rounds", "0", "--out", "/tmp/never-written"], "--rounds must be in 1..10000"),
    (["audit-flower", "--attack", "dlgg", "--out", "/tmp/never-written"], "did you mean 'dlg'"),
    (["audit-flower", "--defense", "gausian:1", "--out", "/tmp/never-written"], "did you mean 'gaussian'"),
]


def test_mistakes_are_answered_before_torch_is_imported():
    """One subprocess for all cases: each is refused with one line and exit 2, and torch is still
    not imported afterwards (it costs 2-3 s of the 4-5 s such an answer took)."""
    code = (
        "import contextlib, io, json, sys\n"
        "from gradleak.cli import main\n"
        "out = []\n"
        f"for argv, _ in {json.dumps(MISTAKES)}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        rc = main(argv)\n"
        "    out.append((rc, err.getvalue(), 'torch' in sys.modules))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    for (argv, word), (rc, err, torch_loaded) in zip(MISTAKES, results, strict=True):
        assert rc == 2, (argv, err)
        assert err.count("\n") == 1 and err.startswith("gradleak: error: ") and word in err, (argv, err)
        assert not torch_loaded, argv
    assert not any("never-written" in p for p in __import__("os").listdir("/tmp"))


def test_list_needs_no_torch():
    code = ("import contextlib, io, sys\nfrom gradleak.cli import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n    rc = main(['list'])\n"
            "print(rc, 'torch' in sys.modules)\nprint(buf.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    first, _, listing = proc.stdout.partition("\n")
    assert first == "0 False", proc.stderr
    for name in (*catalog.MODELS, *catalog.SOURCES, *catalog.IMAGE_ATTACKS, *catalog.EXPERIMENTS):
        assert name in listing
    sections = {s.split(":")[0].split(" (")[0]: s for s in listing.split("\n") if s and not s.startswith(" ")}
    assert {"defenses", "servers", "text models", "experiments"} <= set(sections)
    defenses = listing.split("\ndefenses")[1].split("\nservers")[0]
    servers = listing.split("\nservers")[1].split("\ntext models")[0]
    for name, summary in catalog.DEFENSE_SUMMARIES.items():
        assert f"  {name} " in defenses and summary in defenses
    for name, summary in catalog.SERVER_SUMMARIES.items():
        assert f"  {name} " in servers and summary in servers
    assert "imprint" in catalog.SERVER_SUMMARIES and "gaussian" in catalog.DEFENSE_SUMMARIES


def test_cli_error_line_is_bounded(capsys):
    from gradleak.cli import main
    from gradleak.errors import ConfigError

    def boom(args):
        raise ConfigError("bad value " + "y" * 10_000_000 + "\nsecond line")

    import gradleak.cli as cli

    parser = cli.build_parser()
    args = parser.parse_args(["list"])
    args.func = boom
    real = cli.build_parser

    class P:
        def parse_args(self, argv):
            return args

    cli.build_parser = lambda: P()
    try:
        assert main(["list"]) == 2
    finally:
        cli.build_parser = real
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= cli.MAX_ERROR_LINE + 40


@pytest.mark.parametrize("kind, literal, words", [
    ("server", {"name": "x", "summary": "s", "parameters": ["a"], "integers": ["b"]}, "integers among its parameters"),
    ("server", {"name": "x", "summary": "s", "parameters": "a"}, "lists of names"),
    ("server", {"name": "x", "summary": "s", "rows": 3}, "unknown keys rows"),
    ("text model", {"name": "x", "summary": "s"}, "lacks build"),
])
def test_bad_server_and_text_model_declarations_are_refused(kind, literal, words):
    from gradleak.errors import ConfigError

    with pytest.raises(ConfigError, match=words):
        specs.make_declaration(kind, literal, "gradleak.models.x")
    ok = {"server": {"name": "x", "summary": "s", "parameters": ["a", "b"], "integers": ["b"]},
          "text model": {"name": "x", "summary": "s", "build": "_x"}}[kind]
    assert specs.make_declaration(kind, ok, "gradleak.models.x").name == "x"
