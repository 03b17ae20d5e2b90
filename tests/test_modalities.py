"""Modalities are plug-ins: each declares itself once (modalities.py, torch-free) and its case
(pipeline/<name>.py); the CLI, the config and the run ask the declaration instead of comparing
modality names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradleak import catalog
from gradleak.errors import UnknownNameError
from gradleak.modalities import IMAGE, MODALITIES, TEXT, modality_named, recorded_modality

SRC = Path(__file__).resolve().parents[1] / "src" / "gradleak"


@pytest.mark.parametrize("path", [*(f"cli/{p.name}" for p in sorted((SRC / "cli").glob("*.py"))), "config.py",
                                  "pipeline/run.py", "pipeline/case.py", "outcome.py"])
def test_no_modality_branches_outside_the_plugins(path):
    names = "|".join(re.escape(n) for n in MODALITIES)
    source = (SRC / path).read_text()
    # a state saved before --modality existed names no attack (cli/attack.py's cmd_resume): its owner's to move
    source = source.replace('values.get("modality", "image") == "image"', "")
    found = re.findall(rf'[!=]=\s*"(?:{names})"|"(?:{names})"\s*[!=]=|"(?:{names})"\s+if\b|\[\s*"(?:{names})"\s*\]',
                       source)
    assert not found, (path, found)


def test_declarations_resolve_to_their_plugins():
    from gradleak.pipeline import case
    from gradleak.pipeline.image import ImageCase
    from gradleak.pipeline.text import TextCase

    assert ImageCase.spec is IMAGE and TextCase.spec is TEXT
    for m in MODALITIES.values():
        __import__(m.plugin)
        assert m.name in case.MODALITIES, m.name
        for ref in (m.share, m.report):
            module, _, attr = ref.partition(":")
            assert callable(getattr(__import__(module, fromlist=[attr]), attr)), ref
        assert m.attack_kind in catalog.KINDS and m.model_kind in catalog.KINDS
        assert m.default_attack is None or m.default_attack in catalog.KINDS[m.attack_kind]


def test_lookups():
    assert modality_named("text") is TEXT
    with pytest.raises(UnknownNameError, match="known: image, text"):
        modality_named("audio")
    # a record naming no modality (image runs' metrics.json), or one none declares, reads as image
    assert recorded_modality(None) is IMAGE and recorded_modality(["text"]) is IMAGE
    assert recorded_modality("text") is TEXT


def test_config_rules_come_from_the_declarations():
    from gradleak.config import ConfigError, make_config

    with pytest.raises(ConfigError, match="--text needs --modality text"):
        make_config(text=["a b"])
    with pytest.raises(ConfigError, match="--server applies to image models"):
        make_config(modality="text", server="imprint")
    cfg = make_config(modality="text")
    assert cfg.attack == "dlg" and "attack" not in cfg.model_fields_set
    assert make_config().attack == "auto"


def test_text_models_have_a_registry():
    from gradleak.text.models import build_text_model, describe_text_models, text_model_names

    assert describe_text_models() == catalog.TEXT_MODELS
    assert text_model_names() == list(catalog.TEXT_MODELS)
    with pytest.raises(UnknownNameError, match="did you mean 'tiny-transformer'"):
        build_text_model("tiny-transformr")


def test_declarations_need_no_torch():
    code = ("import sys\nfrom gradleak import config, modalities, outcome\n"
            "config.AttackConfig(modality='text')\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
