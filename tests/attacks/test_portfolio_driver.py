"""The one portfolio driver (attacks/portfolio.py) both choosers run: a tiny fake portfolio through
it (refusals recorded, the best answer kept, the early stop, the record, the scopes), and the image
and text choosers' ``run`` each handing their hooks to it."""

from types import SimpleNamespace

import pytest

from gradleak.attacks import auto
from gradleak.attacks.portfolio import Portfolio, run_portfolio, score
from gradleak.engine import StateFileError
from gradleak.errors import ConfigError, GradleakError
from gradleak.text.attacks import auto as text_auto


class FakeEngine:
    """Runs a member by looking up its canned answer (or error), noting the scope it ran under."""

    def __init__(self, outcomes):
        self.outcomes, self.scopes = outcomes, []
        self.session = SimpleNamespace(scope="")

    def run(self, member, update, model):
        self.scopes.append((member, self.session.scope))
        out = self.outcomes[member]
        if isinstance(out, Exception):
            raise out
        return SimpleNamespace(extra={"relative_gradient_distance": out}, wall_seconds=1.25, iterations=3,
                               alternatives=[])


class FakePortfolio(Portfolio):
    """Members named by the canned outcomes; "skip" refuses in its check; stops within 1e-6."""

    def __init__(self, names, unanswered=None):
        super().__init__(update=None, model=None)
        self.names, self.fallback, self.calls = names, unanswered, []

    def members(self):
        return self.names

    def resolve(self, name):
        return name

    def check(self, name):
        if name == "skip":
            raise ConfigError("skip: not for\nthis model")

    def floor(self, rec):
        return "floor"

    def judge(self, name, rec, floor):
        rel = rec.extra["relative_gradient_distance"]
        return SimpleNamespace(converged=rel < 1e-3, relative_gradient_distance=rel)

    def entry(self, answer):
        return {"iterations": answer.rec.iterations}

    def enough(self, answer):
        return f"{answer.name} is exact" if answer.conv.relative_gradient_distance <= 1e-6 else ""

    def unanswered(self, answers):
        return self.fallback(answers) if self.fallback else None

    def why_kept(self, best, tried, answers):
        return f"{best.name} is best of {len(answers)}"

    def recorded(self):
        return {"portfolio": list(self.names)}

    def started(self, name, engine):
        self.calls.append(("started", name))

    def finished(self, name, engine):
        self.calls.append(("finished", name))

    def kept(self, name, engine):
        self.calls.append(("kept", name))


def test_the_driver_records_refusals_keeps_the_best_and_stops_early():
    engine = FakeEngine({"broken": GradleakError("broken: no"), "far": 0.5, "near": 0.01, "exact": 1e-9,
                         "never": 0.0})
    chooser = FakePortfolio(["skip", "broken", "far", "near", "exact", "never"])
    rec = run_portfolio(chooser, engine)
    tried = rec.extra["auto"]["tried"]
    assert tried[0] == {"attack": "skip", "applies": False, "why": "skip: not for\\nthis model"}
    assert tried[1] == {"attack": "broken", "applies": False, "why": "broken: no", "error": "GradleakError"}
    assert tried[2] == {"attack": "far", "applies": True, "converged": False, "relative_gradient_distance": 0.5,
                        "seconds": 1.25, "iterations": 3}
    assert [t["attack"] for t in tried] == ["skip", "broken", "far", "near", "exact"]   # "never" never ran
    assert rec.extra["attack_used"] == "exact" and rec.extra["auto"]["why"] == "exact is exact"
    assert list(rec.extra["auto"]) == ["used", "why", "tried", "portfolio"]
    assert rec.wall_seconds == 3 * 1.25 and [a for a, _ in rec.alternatives] == ["far", "near"]
    assert engine.scopes == [(n, f"{n}/") for n in ("broken", "far", "near", "exact")]
    assert engine.session.scope == ""
    assert chooser.calls[:3] == [("started", "broken"), ("started", "far"), ("finished", "far")]
    assert chooser.calls[-1] == ("kept", "exact")


def test_without_an_early_stop_the_best_is_kept_and_the_chooser_says_why():
    rec = run_portfolio(FakePortfolio(["far", "near", "farther"]),
                        FakeEngine({"far": 0.5, "near": 0.01, "farther": 0.9}))
    assert rec.extra["attack_used"] == "near" and rec.extra["auto"]["why"] == "near is best of 3"
    assert [a for a, _ in rec.alternatives] == ["far", "farther"]


def test_the_last_error_ends_the_run_only_when_no_answer_is_left():
    with pytest.raises(ConfigError, match="second"):
        run_portfolio(FakePortfolio(["skip", "a", "b"]),
                      FakeEngine({"a": GradleakError("first"), "b": ConfigError("second")}))
    engine = FakeEngine({"a": StateFileError("torn state"), "b": 0.1})
    with pytest.raises(StateFileError):   # a broken checkpoint is never "does not apply"
        run_portfolio(FakePortfolio(["a", "b"]), engine)
    assert engine.session.scope == ""


def test_a_chooser_keeps_an_answer_none_ranked_when_it_says_so():
    class NeverBetter(FakePortfolio):
        def better(self, answer, best):
            return False

    chooser = NeverBetter(["a"], unanswered=lambda answers: (answers[0], "only a answered"))
    rec = run_portfolio(chooser, FakeEngine({"a": 0.2}))
    assert rec.extra["attack_used"] == "a" and rec.extra["auto"]["why"] == "only a answered"
    assert score(rec) == 0.2 and score(SimpleNamespace(extra={"relative_gradient_distance": float("nan")})) > 1e300


def test_both_choosers_run_the_one_driver(monkeypatch):
    seen = []
    for module in (auto, text_auto):
        monkeypatch.setattr(module, "run_portfolio", lambda chooser, engine: seen.append(chooser) or "kept")
    monkeypatch.setattr(auto, "noise_floor", lambda update: "floor")
    update = SimpleNamespace(meta=SimpleNamespace(batch_size=2))
    cfg = SimpleNamespace(seed=0, portfolio=(SimpleNamespace(attack="dlg"), SimpleNamespace(attack="ig")),
                          members=("dlg", "ig"))
    assert auto.run(cfg, update, None, None) == "kept"
    assert text_auto.run(SimpleNamespace(seed=0), update, None, None) == "kept"
    image, text = seen
    assert isinstance(image, auto.ImagePortfolio) and isinstance(text, text_auto.TextPortfolio)
    assert image.members()[-2:] == ("dlg", "ig") and image.scope("dlg") == "dlg/" and image.scope("analytic") == ""
    assert text.members() == ("dager", "dlg", "lamp") and text.scope("lamp") == "lamp/"
