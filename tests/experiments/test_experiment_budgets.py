"""The experiments measure at fixed budgets: every DLG/iDLG cell they plan runs its whole budget
(experiments.common.DLG_STOP, "budget"), not the settled stop of the interactive default, so
rerunning a reproduction/ folder's command.txt gives its committed results.csv (checked by hand
on reproduction/optimizers: 9 rows, every column equal but the wall times).

Each experiment is stopped at its first plan (Workspace.run replaced): nothing is attacked.
property-inference is left out (it fits its property classifier before planning, ~25 s); it
plans its cells with common.lbfgs_cell like local-iterations, training-stage and defenses."""

from __future__ import annotations

import pytest

from gradleak.experiments import cells as cells_mod
from gradleak.experiments import make_options, run_experiment

DLG_EXPERIMENTS = {"optimizers": {}, "comparison": {}, "batch-size": {}, "model-size": {"attacks": ["dlg", "idlg"]},
                   "local-iterations": {}, "training-stage": {}, "defenses": {}}


class _Planned(Exception):
    pass


@pytest.mark.parametrize("name", sorted(DLG_EXPERIMENTS))
def test_dlg_cells_of_the_experiments_run_their_whole_budget(name, tmp_path, monkeypatch):
    planned: list[dict] = []

    def first_plan(self, cells, *, run_folders=()):  # noqa: ANN001, ANN202
        planned.extend(dict(c) for c in cells.values())
        raise _Planned

    monkeypatch.setattr(cells_mod.Workspace, "run", first_plan)
    with pytest.raises(_Planned):
        run_experiment(name, make_options(out=str(tmp_path / name), smoke=True, progress=False,
                                          **DLG_EXPERIMENTS[name]))
    # (the image attacks: the defenses experiment's text row runs text DLG, which has no --stop)
    dlg = [c for c in planned if c.get("attack") in ("dlg", "idlg") and c.get("modality") != "text"]
    assert dlg, f"{name} planned no DLG/iDLG cell: {planned[:2]}"
    assert all(c.get("stop") == "budget" for c in dlg), [c.get("stop") for c in dlg]
