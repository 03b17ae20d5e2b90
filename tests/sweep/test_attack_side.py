"""The attacker's fields are derived from the attacks' SPECs (issue 58): a sweep over several attacks
whose cells also vary one attack's own constant (CPA's --ica-iterations) is still one client per
client setting on the dashboard, judged by the worst case over every attack run on it."""

import re

from gradleak.report.dashboard import render_dashboard
from gradleak.report.dashboard.data import ATTACK_SIDE
from gradleak.report.risk import DEFENDED, LEAKED
from gradleak.specs import attack_specs, attacker_fields, flat_flags
from gradleak.sweep import ResultStore, cells_spec
from gradleak.sweep.dashboard_cli import sweep_stores

BASE = {"model": "mlp", "data": "cifar10-samples", "threads": 1, "paper_metrics": False}
ROW = re.compile(r"<tr class=\"r-(\w+)\">(.*?)</tr>", re.S)


def _metrics(attack: str, psnr: float, defended: bool) -> dict:
    """A stored cell's metrics (no attack run): a converged answer; under the defense the evidence
    "defended" needs (a noise floor above the line, the truth's own distance, a leaking control)."""
    evidence = ({"defenses": ["gaussian:1"], "truth_relative_distance": 1e-9, "control": {"verdict": "leaked"}}
                if defended else {})
    return {"attack": attack, "psnr_mean": psnr, "ssim_mean": 0.5, "label_accuracy": 1.0, "converged": True,
            "relative_gradient_distance": 1e-9,
            "convergence": {"converged": True, "relative_gradient_distance": 1e-9,
                            "noise_floor": 1.0 if defended else 0.0}, **evidence}


def test_attacker_fields_are_every_specs_flags():
    """Every constant any attack of any modality declares is the attacker's; no client field is."""
    declared = {f for m in ("image", "text") for s in attack_specs(m).values() for f in s.flags}
    assert declared == set(flat_flags()) and declared <= attacker_fields() <= ATTACK_SIDE
    assert "ica_iterations" in ATTACK_SIDE and "beam_width" in ATTACK_SIDE and "lm_weight" in ATTACK_SIDE
    assert not {"model", "defense", "threat", "modality", "data", "batch_size", "seed"} & ATTACK_SIDE


def test_a_sweep_varying_ica_iterations_across_attacks_is_one_client_row(tmp_path):
    """attack [cpa (ica 50), cpa (ica 400), idlg, ig] x defense [none, gaussian:1]: two client
    settings, each one row of the worst case over the four attacks. CPA at 400 ICA steps rebuilds
    the undefended client (35 dB), the others do not: that client leaked, by cpa; under the defense
    every attack is defended, so that client is defended."""
    configs, scores = [], []
    for defense in ([], ["gaussian:1"]):
        for attack, extra, psnr in (("cpa", {"ica_iterations": 50}, 12.0), ("cpa", {"ica_iterations": 400}, 35.0),
                                    ("idlg", {}, 11.0), ("ig", {}, 13.0)):
            configs.append({**BASE, "attack": attack, "defense": defense, **extra})
            scores.append(_metrics(attack, 12.0 if defense else psnr, bool(defense)))
    spec, ids = cells_spec(configs)
    assert len(spec.cells) == 8 and "ica_iterations" in spec.cells[0].grid
    with ResultStore(tmp_path) as store:
        for cell_id, cell in zip(ids, spec.cells, strict=True):
            store.add(cell_id, cell.grid, cell.config,
                      {"status": "ok", "metrics": scores[ids.index(cell_id)], "wall_seconds": 1.0})
    page = render_dashboard(tmp_path, None, stores=sweep_stores()).read_text()
    section = page.split("<h2>Worst case over the attacks, per client setting</h2>", 1)[1].split("<h2>", 1)[0]
    header = re.search(r"<tr>(.*?)</tr>", section, re.S).group(1)
    assert "ica_iterations" in header.split("verdict per attack", 1)[1]   # an attacker's column, not a client's
    rows = ROW.findall(section)
    assert len(rows) == 2, rows   # one row per defense: the ICA budgets do not split a client
    by_defense = {("gaussian:1" if "gaussian:1" in r else "none"): (v, r) for v, r in rows}
    assert by_defense["none"][0] == LEAKED and "<td>cpa, 400</td>" in by_defense["none"][1]
    assert by_defense["gaussian:1"][0] == DEFENDED


def test_cell_identities_hash_the_fields_they_always_hashed():
    """Sweep identities are derived from the SPECs too (each attack's "hashed_flags" beside the
    run's own fields): the set is frozen, or stores of before would recompute every cell."""
    import hashlib

    from gradleak.specs import hashed_flags
    from gradleak.sweep.spec import HASHED_FIELDS, HASHED_RUN_FIELDS

    assert hashlib.sha256(",".join(sorted(HASHED_FIELDS)).encode()).hexdigest()[:16] == "bbe32f5e00a52a79"
    assert hashed_flags() <= set(flat_flags()) and not HASHED_RUN_FIELDS & set(flat_flags())
