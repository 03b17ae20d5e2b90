"""The hooks an attack's SPEC declares for the code outside it (specs.py): the case a flag's value
fills in, the flag --nproc spreads, the one-start values, the chooser's member flag. Torch-free."""

from __future__ import annotations

import pytest

from gradleak.errors import ConfigError
from gradleak.specs import attack_specs, case_fields, flag_cases, make_spec, member_flags, preset_names

MINIMAL = {"name": "x", "summary": "s", "kind": "optimisation", "converged_below": 0.1, "needs": "n",
           "flags": {"iterations": 10, "tries": ["int[1,9]", 2, "tries"]}}


def test_a_hook_naming_no_flag_of_its_attack_is_refused():
    for hook in ({"one_start": {"restarts": 1}}, {"shards": "seeds"}, {"cases": {"mode": {"a": {"model": "m"}}}}):
        with pytest.raises(ConfigError, match="which are not its flags"):
            make_spec({**MINIMAL, **hook}, "gradleak.attacks.x")
    spec = make_spec({**MINIMAL, "one_start": {"tries": 1}, "shards": "tries"}, "gradleak.attacks.x")
    assert spec.one_start == {"tries": 1} and spec.shards == "tries" and spec.cases == {}


def test_value_of_is_the_given_value_else_the_presets_else_the_default():
    gi = attack_specs()["gradinversion"]
    assert gi.shards == "seeds"
    assert [gi.value_of("seeds", v) for v in ({}, {"preset": "paper"}, {"preset": "imagenet"},
                                               {"preset": "nonsense"}, {"preset": "paper", "seeds": 7})] == [4, 8, 2, 4, 7]
    assert make_spec(MINIMAL, "gradleak.attacks.x").value_of("tries", {"preset": "paper"}) == 2


def test_the_imagenet_preset_names_its_case_and_an_update_file_only_its_attack():
    assert set(flag_cases("image")) == {"preset"} and flag_cases("text") == {}
    case = {"attack": "gradinversion", "model": "efficientnet-lite0", "data": "imagenet-samples", "batch_size": 8,
            "share_bn_statistics": True}
    assert case_fields({"preset": "imagenet"}, update=False) == case
    assert case_fields({"preset": "imagenet"}, update=True) == {"attack": "gradinversion"}
    assert case_fields({"preset": "paper"}, update=False) == {} == case_fields({}, update=False)


def test_one_start_member_flag_and_presets_as_declared():
    specs = attack_specs()
    assert {n: s.one_start for n, s in specs.items() if s.one_start} == {
        "dlg": {"stall_restarts": 0}, "idlg": {"stall_restarts": 0}, "ig": {"restarts": 1}}
    assert member_flags() == ("fallback",)
    assert preset_names() == ("cpu", "imagenet", "paper")
