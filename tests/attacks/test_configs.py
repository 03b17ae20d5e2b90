"""Issue 58: one attack-config resolution for image and text (attacks/configs.py resolve_config).
What differs between the modalities is data (MODALITY_CONFIGS: the catalog kind, the message
prefix, the configs, the flat constants checked); the refusal of a constant the attack does not
read, the per-model defaults, the attack's resolve hook and ValidationError -> ConfigError are
one code path, which resolve_attack and resolve_text_attack both call."""

from types import SimpleNamespace

import pytest

from gradleak import specs
from gradleak.attacks.configs import (MODALITY_CONFIGS, Resolution, TEXT_ATTACK_CONFIGS, config_class,
                                      resolve_attack, resolve_config)
from gradleak.errors import ConfigError, UnknownNameError
from gradleak.text.configs import resolve_text_attack, text_config_class
from gradleak.text.leak import TextResolution

TINY = SimpleNamespace(name="tiny-transformer")


def test_every_modality_resolves_by_the_one_path_from_its_specs():
    """Each modality the SPECs declare has its data row, whose configs are its attacks'
    (the image chooser's own AutoConfig included); text_config_class is config_class("text")."""
    assert set(MODALITY_CONFIGS) == set(specs.COMMON_BY_MODALITY)
    for modality, found in MODALITY_CONFIGS.items():
        assert set(found.configs) == set(specs.attack_specs(modality)), modality
        for name, cls in found.configs.items():
            assert cls.spec.modality == modality and config_class(name, modality) is cls
    assert MODALITY_CONFIGS["text"].configs is TEXT_ATTACK_CONFIGS
    assert all(text_config_class(name) is TEXT_ATTACK_CONFIGS[name] for name in TEXT_ATTACK_CONFIGS)


def test_one_path_resolves_an_image_and_a_text_attack():
    """resolve_config gives what the modalities' own entry points give: IG's alpha_TV scaled by
    its resolve hook to the attacked model's layers, and text DLG's per-model defaults with its
    label rule (bias for one sentence, soft for a batch)."""
    layers = (40, 8)
    image = resolve_config("image", {"attack": "ig", "seed": 2, "restarts": 3}, Resolution(False, layers))
    assert image == resolve_attack({"attack": "ig", "seed": 2, "restarts": 3}, bn_statistics_shared=False,
                                   layers=layers)
    assert (image.seed, image.restarts) == (2, 3)
    assert image.alpha_tv != resolve_config("image", {"attack": "ig"}, Resolution(False, (10, 0))).alpha_tv
    for k, labels in ((1, "bias"), (2, "soft")):
        text = resolve_config("text", {"attack": "dlg", "seed": 1, "lr": 0.5}, TextResolution(TINY.name, k),
                              model=TINY.name)
        assert text == resolve_text_attack({"attack": "dlg", "seed": 1, "lr": 0.5}, TINY, k)
        model_defaults = specs.attack_specs("text")["dlg"].defaults_for(TINY.name)
        assert (text.lr, text.labels, text.iterations) == (0.5, labels, model_defaults["iterations"])
    minilm = resolve_text_attack({"attack": "dlg"}, SimpleNamespace(name="minilm"), 2)
    assert minilm.iterations == specs.attack_specs("text")["dlg"].defaults_for("minilm")["iterations"]


def test_one_path_refuses_a_foreign_constant_in_each_modality():
    """The same check refuses a constant the attack does not read, naming the modality's kind:
    an image attack a text attack's constant, a text attack another text attack's constant."""
    with pytest.raises(ConfigError) as image:
        resolve_config("image", {"attack": "ig", "beam_width": 4}, Resolution(True, None))
    assert str(image.value) == "option --beam-width does not apply to attack 'ig'"
    with pytest.raises(ConfigError) as text:
        resolve_config("text", {"attack": "dlg", "beam_width": 4}, TextResolution(TINY.name, 1), model=TINY.name)
    assert str(text.value) == "option --beam-width does not apply to text attack 'dlg'"
    with pytest.raises(ConfigError, match=r"^option --beam-width does not apply to text attack 'dlg'$"):
        resolve_text_attack({"attack": "dlg", "beam_width": 4}, TINY, 1)
    with pytest.raises(ConfigError, match=r"^option --beam-width does not apply to attack 'ig'$"):
        resolve_attack({"attack": "ig", "beam_width": 4}, bn_statistics_shared=True)


def test_one_path_names_the_modality_in_unknown_names_and_refused_values():
    """An unknown name is an unknown "attack" or "text attack"; a value out of range names the
    attack and the field, text's prefixed "text "."""
    with pytest.raises(UnknownNameError, match=r"^unknown attack 'bow'"):
        resolve_config("image", {"attack": "bow"}, Resolution(True, None))
    with pytest.raises(UnknownNameError, match=r"^unknown text attack 'ig'"):
        resolve_text_attack({"attack": "ig"}, TINY, 1)
    with pytest.raises(ConfigError, match=r"^ig: lr: Input should be greater than 0$"):
        resolve_attack({"attack": "ig", "lr": -1.0}, bn_statistics_shared=True)
    with pytest.raises(ConfigError, match=r"^text dlg: lr: Input should be greater than 0$"):
        resolve_text_attack({"attack": "dlg", "lr": -1.0}, TINY, 1)
