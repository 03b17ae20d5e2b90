"""DLG's reviewer 2 at the scale clients train (issue 59): the leakage of a FedAvg update of E local
epochs over K samples in mini-batches, with plain SGD, SGD with momentum and weight decay, or Adam,
augmentation off or on; each update attacked by an attacker that models the announced client and by
one that models it as plain SGD (gradleak's attacker before issue 59), worst case over the attacks."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..report import save_line_plot
from .base import ExperimentOptions, ExperimentResult, experiment
from .cells import CellResult, Workspace
from .common import (DLG_STOP, IMAGE_PAIRING_COLUMNS, IMAGE_VERDICT_COLUMNS, LBFGS_INIT, THRESHOLD_DB, VERDICT_RULE,
                     convergence_notes, image_rows, save_grids, scored_title, summarize, summary_columns,
                     verdict_fields)

# The factors (issue 59, item 5) and their levels.
EPOCHS = (1, 2, 5)
LOCAL_DATA = (4, 16, 64)
# The client's torch.optim optimizer: plain SGD and SGD momentum 0.9 + weight decay 5e-4 at the Done-when's
# local lr 0.05; Adam at torch's default lr 1e-3 (betas 0.9, 0.999, eps 1e-8).
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "sgd": dict(local_lr=0.05),
    "sgd-momentum": dict(local_lr=0.05, local_momentum=0.9, local_weight_decay=5e-4),
    "adam": dict(local_lr=1e-3, local_optimizer="adam"),
}
# Augmentation on: random crops (zero padding 4) and horizontal flips, drawn privately per sample and step.
AUGMENT = ("none", "crop-flip")
# Local mini-batch size: a fixed B = 2, as a client fixes its batch size whatever its data: K = 4 is two
# steps per epoch, K = 16 eight.
LOCAL_BATCH_SIZE = 2


class Client(NamedTuple):
    epochs: int
    local_data: int
    optimizer: str
    augment: str
    local_batch_size: int = LOCAL_BATCH_SIZE   # min(B, K) in each step


FACTORS = Client._fields[:4]


# The declared design (results.md says which ran). The full factorial does not fit one core in an
# hour at an honest attack budget: one DLG iteration (L-BFGS, <= 20 evaluations) of the unroll took
# 1.6 s of CPU at E=2, K=16, 6.4 s at E=2, K=64 and 4.3 s at E=5, K=16, and on the loaded machine
# the first cells ran at ~13 s of wall time per 40 DLG iterations x E x K (E=2, K=4 momentum: 103 s
# for 40 iterations in full-batch steps), so the 54 clients x 2 attackers would take about a day. The default design is
# one factor at a time around BASE plus the cheap corner; LEFT_OUT lists the levels it could not
# afford (the factorial design, on a larger machine, has them all).
BASE = Client(2, 4, "sgd-momentum", "none")
CORNERS = (Client(1, 4, "sgd", "none"),)
# The order control: the base client in full-batch steps (B = K), where the client's private order
# cannot differ from the attacker's; beside the base it shows what the order costs the attacker.
CONTROLS = (Client(2, 4, "sgd-momentum", "none", 4),)
LEFT_OUT = {Client(2, 64, "sgd-momentum", "none"): "K = 64: 16x the base's cost per attack (~55 min of wall time "
                                                    "for the two attackers on this loaded machine)",
            Client(5, 64, "adam", "crop-flip"): "the far corner: 40x the base's cost"}
DESIGNS = ("one-factor", "factorial")
DESIGN = "one-factor"
# --smoke: one epoch of the base client (two mini-batches of 2, momentum and weight decay). Measured:
# smaller clients are harder for DLG at 40 iterations (K = 2 in mini-batches of 1: 5.2 dB on one photo).
SMOKE_CLIENTS = (Client(1, 4, "sgd-momentum", "none"),)

# The attacks that apply to a multi-step FedAvg update of a sigmoid LeNet (no closed form reads it,
# no BatchNorm for GradInversion): DLG (float64 L-BFGS from mid-grey pixels, soft labels, one start)
# and Inverting Gradients (label counts restored from the update, K may exceed the classes).
ATTACKS: dict[str, dict[str, Any]] = {
    "dlg": dict(attack="dlg", dtype="float64", init=LBFGS_INIT, stop=DLG_STOP, stall_restarts=0),
    "ig": dict(attack="ig", labels="counts"),
}
# Inverting Gradients runs on the clients of E x K <= IG_MAX_WORK sample-epochs only (one-factor design): on
# the first clients (E = 1-2, K = 4) it stayed at 9.7-10.9 dB, around the public prior image, where DLG
# rebuilt 20-35 dB, and its cells cost a third of the remaining time on the loaded machine.
IG_MAX_WORK = 8
# Iterations per attack (smoke, full).
# DLG at 40 iterations: on E=2, K=4 momentum it passed 22 dB at iteration 10 and 30 dB at 20 (49.8 dB at 100).
ITERATIONS: dict[str, tuple[int, int]] = {"dlg": (40, 40), "ig": (40, 300)}
# The attacker: "modelled" reads the update file's record (optimizer, its constants, epochs);
# "plain-sgd" the same update with the record stripped to plain SGD's keys, as gradleak's attacker
# modelled every client before issue 59 (benchmarks/local_training.py does the same).
ATTACKERS = ("modelled", "plain-sgd")
PLAIN_KEYS = ("name", "local_steps", "local_batch_size", "local_lr", "local_epochs")
WORST = "worst case"
MODEL, DATA = "lenet-dlg", "fashion-mnist"
KEY = Client._fields


def clients(design: str) -> list[Client]:
    """The design's clients: the full factorial, or BASE, each factor's other levels around it, and CORNERS."""
    if design == "factorial":
        return [Client(*c) for c in itertools.product(EPOCHS, LOCAL_DATA, OPTIMIZERS, AUGMENT)]
    out = [BASE]
    for field, levels in zip(FACTORS, (EPOCHS, LOCAL_DATA, tuple(OPTIMIZERS), AUGMENT), strict=True):
        out += [BASE._replace(**{field: v}) for v in levels if v != getattr(BASE, field)]
    return [c for c in out if c not in LEFT_OUT] + [c for c in (*CORNERS, *CONTROLS) if c not in out]


def attacks_of(c: Client, attacks: list[str], design: str) -> list[str]:
    """The attacks run on client ``c``: all, but Inverting Gradients only up to IG_MAX_WORK sample-epochs
    in the one-factor design."""
    return [a for a in attacks if a != "ig" or design != "one-factor" or c.epochs * c.local_data <= IG_MAX_WORK]


def client_fields(c: Client, seed: int, data: str, model: str) -> dict[str, Any]:
    """The simulated client's config fields: its batch of K photos drawn by ``seed`` (repeated
    labels allowed: K exceeds Fashion-MNIST's 10 classes), its local training."""
    aug = {} if c.augment == "none" else {"local_augment": c.augment}
    return dict(model=model, data=data, batch_size=c.local_data, seed=seed, allow_repeats=True, threat="fedavg",
                local_epochs=c.epochs, local_batch_size=min(c.local_batch_size, c.local_data), **OPTIMIZERS[c.optimizer], **aug)


def plain_sgd_files(ws: Workspace, c: Client, fields: dict[str, Any]) -> tuple[Path, Path]:
    """The client's update file with its record stripped to plain SGD (what the plain-SGD attacker
    reads) and its truth file, under DIR/updates, named by a digest of the client's fields; written
    again on every run (the same bytes: the client is seeded)."""
    from ..config import make_config
    from ..fl import load_update, save_update
    from ..modalities import modality_named

    import hashlib
    import json

    folder = ws.folder / "updates"
    folder.mkdir(exist_ok=True)
    # the cell's identity holds the file's path, not its bytes: the path holds every field of the client
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    stem = "-".join(str(v) for v in c) + f"-seed{fields['seed']}-{digest}"
    full, plain, truth = (folder / f"{stem}{s}.safetensors" for s in ("-full", "-plain-sgd", "-truth"))
    case = modality_named("image").share_client(make_config(**fields))
    case.save(full, truth, force=True)
    update, _ = load_update(full)
    update.meta.threat = {k: v for k, v in update.meta.threat.items() if k in PLAIN_KEYS}
    save_update(update, plain)
    full.unlink()
    return plain, truth


def _rows_of(cell: CellResult, common: dict[str, Any]) -> list[dict[str, Any]]:
    m = cell.metrics
    rows = image_rows(cell, **common, label_accuracy=m["label_accuracy"], client_model=m.get("client_model"),
                      iterations=m["iterations"], wall_seconds=round(float(m["wall_seconds"]), 2))
    for r in rows:
        r.update(verdict_fields(cell, r["psnr"] >= THRESHOLD_DB, image=r["image"]))
    return rows


def worst_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client, attacker and image, the worst case over the attacks: the highest PSNR of each
    pairing and SSIM, and the worst verdict (outcome.worst: leaked before inconclusive, defended
    only if every attack says so); the batch verdict the worst over the batch's images."""
    from ..outcome import worst

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in (*KEY, "attacker", "sample", "image")), []).append(r)
    out = []
    for sel in groups.values():
        best = max(sel, key=lambda r: r["psnr"])
        w = {**best, "attack": WORST, "leaked_by": ",".join(r["attack"] for r in sel if r["verdict"] == "leaked"),
             "verdict": worst(r["verdict"] for r in sel), "converged": any(r["converged"] for r in sel)}
        for k in ("psnr_by_label", "ssim", "ssim_by_label"):
            vals = [r[k] for r in sel if r.get(k) is not None]
            w[k] = max(vals) if vals else None
        for k in ("iterations", "wall_seconds", "relative_gradient_distance", "label_accuracy", "label_restored"):
            w[k] = None
        out.append(w)
    batches: dict[tuple[Any, ...], list[str]] = {}
    for w in out:
        batches.setdefault(tuple(w[k] for k in (*KEY, "attacker", "sample")), []).append(w["verdict"])
    for w in out:
        w["batch_verdict"] = worst(batches[tuple(w[k] for k in (*KEY, "attacker", "sample"))])
    return out


def _check(opt: ExperimentOptions) -> None:
    if opt.attacks:
        unknown = [a for a in opt.attacks if a not in ATTACKS]
        if unknown:
            raise ConfigError(f"local-training runs {' and '.join(ATTACKS)} (the attacks that read a multi-step "
                              f"FedAvg update of LeNet): --attacks {','.join(unknown)} does not apply")
    if opt.batch_sizes and any(k > 256 for k in opt.batch_sizes):
        raise ConfigError("local-training: --batch-sizes (the clients' local data sizes) at most 256")


SPEC = {
    "name": "local-training",
    "summary": ("leakage vs the client's local training (epochs, local data size, SGD / momentum + weight decay / "
                "Adam, augmentation): the modelled vs the plain-SGD attacker, worst case over attacks"),
}


def _plan(ws: Workspace, opt: ExperimentOptions, grid: list[Client], attacks: list[str],
          iterations: dict[str, int], design: str, samples: int) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The cells: each client, sample and attack, once per attacker (one cell where both model the
    same client); the plain-SGD attacker reads the same update with its record stripped."""
    model, data = opt.model or MODEL, opt.data or DATA
    plan: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in grid:
        for s in range(samples):
            fields = client_fields(c, opt.seed + s, data, model)
            # plain SGD without augmentation: the two attackers model the same client (one cell)
            plain = None if c.optimizer == "sgd" and c.augment == "none" else plain_sgd_files(ws, c, fields)
            for a in attacks_of(c, attacks, design):
                run = dict(**ATTACKS[a], iterations=iterations[a], log_every=max(1, iterations[a] // 10))
                plan[(*c, "modelled", a, s)] = {**fields, **run}
                if plain is not None:
                    plan[(*c, "plain-sgd", a, s)] = dict(update=str(plain[0]), truth=str(plain[1]),
                                                         seed=fields["seed"], **run)
    return plan


def _rows(opt: ExperimentOptions, grid: list[Client], plan: dict[tuple[Any, ...], dict[str, Any]],
          cells: dict[Any, CellResult], attacks: list[str], design: str, samples: int) -> list[dict[str, Any]]:
    """results.csv's rows: every image of every attacked batch, per attacker and attack."""
    rows: list[dict[str, Any]] = []
    for c in grid:
        for s in range(samples):
            for attacker in ATTACKERS:
                for a in attacks_of(c, attacks, design):
                    key = (*c, attacker, a, s)
                    same = key not in plan
                    cell = cells[(*c, "modelled", a, s) if same else key]
                    if cell.ok:
                        rows += _rows_of(cell, {**c._asdict(), "local_steps": c.epochs * -(-c.local_data // min(
                            c.local_batch_size, c.local_data)), "attacker": attacker, "attack": a, "sample": s,
                            "seed": opt.seed + s, "same_as_modelled": same})
    return rows


def _setup(opt: ExperimentOptions, grid: list[Client], attacks: list[str], iterations: dict[str, int],
           design: str, samples: int, data: str, model: str) -> dict[str, Any]:
    """results.md's setup: what ran, the design, the attackers and the verdict rule."""
    return {"data": f"{data} (train split; the project's attacks were tuned on CIFAR-10 and scikit-image photos, "
                    "not on it); each client's K photos drawn by its seed, labels may repeat",
            "model": f"{model}, random weights (model seed 0)",
            "design": design if not opt.batch_sizes else f"{design}, local data {list(opt.batch_sizes)}",
            "clients": [dict(c._asdict()) for c in grid],
            "base client": dict(BASE._asdict()), "corners": [dict(c._asdict()) for c in CORNERS],
            "order control": [dict(c._asdict()) for c in CONTROLS],
            **({"not run": {" ".join(str(v) for v in c): why for c, why in LEFT_OUT.items()}}
               if design == "one-factor" else {}),
            "local training": f"--local-epochs E over the K samples in mini-batches of min(K, local_batch_size) "
                              f"(local_batch_size {LOCAL_BATCH_SIZE} but in the order control, B = K), reshuffled "
                              "privately each epoch; optimizers "
                              + "; ".join(f"{k}: {v}" for k, v in OPTIMIZERS.items())
                              + "; augmentation crop-flip = random crop (zero padding 4) then a horizontal flip, "
                                "drawn privately",
            "attackers": "modelled: the update file's record (optimizer and its constants, epochs, mini-batch, "
                         "lr); plain-sgd: the same update, its record stripped to "
                         f"{list(PLAIN_KEYS)} (gradleak's attacker before issue 59); neither knows the order, "
                         "the augmentation draws or the labels",
            "attacks": {a: {**ATTACKS[a], "iterations": iterations[a]} for a in attacks},
            **({"ig": f"only on the clients of E x K <= {IG_MAX_WORK} (see the module: its cost)"}
               if design == "one-factor" and "ig" in attacks else {}),
            "worst case": f"rows with attack '{WORST}': per image the highest PSNR (each pairing) over the "
                          "attacks, and the worst verdict (gradleak/outcome.py's worst)",
            "samples": samples, "seeds": f"{opt.seed}..{opt.seed + samples - 1} (batch drawn, client's private "
                                         "order and augmentation, attack start)",
            "verdict": f"per image: leaked = PSNR >= {THRESHOLD_DB} dB or recognisable (outcome.py); "
                       f"{VERDICT_RULE}", "smoke": opt.smoke}


@experiment("local-training")
def local_training(opt: ExperimentOptions, ws: Workspace) -> ExperimentResult:
    _check(opt)
    model, data = opt.model or MODEL, opt.data or DATA
    attacks = opt.attacks or list(ATTACKS)
    samples = opt.samples or 1
    pick = 0 if opt.smoke else 1
    iterations = {a: opt.iterations or ITERATIONS[a][pick] for a in attacks}
    design = "smoke" if opt.smoke else DESIGN
    grid = list(SMOKE_CLIENTS) if opt.smoke else clients(DESIGN)
    grid.sort(key=lambda c: c.epochs * c.local_data)  # the cheapest cells first: an interrupted run has them
    if opt.batch_sizes:
        grid = list(dict.fromkeys(c._replace(local_data=k) for c in grid for k in opt.batch_sizes))
    plan = _plan(ws, opt, grid, attacks, iterations, design, samples)
    shown = [k for k in plan if k[5] == "modelled" and k[7] == 0 and k[1] <= 16]
    cells = ws.run(plan, run_folders=shown)
    rows = _rows(opt, grid, plan, cells, attacks, design, samples)
    rows += worst_rows(rows)
    by = [*KEY, "attacker", "attack"]
    values = ("psnr_by_label", "psnr", "ssim", "zero_psnr", "prior_psnr")
    summary = summarize(rows, by, values=values, images=True)
    figures = _figures(ws, rows, grid, cells, attacks)
    return ExperimentResult(
        name="local-training", title="Leakage vs the client's local training: epochs, local data, optimizer, "
                                     "augmentation; modelled vs plain-SGD attacker",
        columns=[*KEY, "local_steps", "attacker", "attack", "sample", "seed", "image", "name", "label",
                 "label_restored", "psnr_by_label", "psnr", "ssim", *IMAGE_PAIRING_COLUMNS[1:], "identified",
                 "label_accuracy", *IMAGE_VERDICT_COLUMNS, "leaked_by", "same_as_modelled", "client_model",
                 "iterations", "wall_seconds"],
        rows=rows, figures=figures, summary=summary, summary_columns=summary_columns(by, values, images=True),
        setup=_setup(opt, grid, attacks, iterations, design, samples, data, model),
        notes=["Every image of every attacked batch is a row, once per attack and once for the worst case over the "
               "attacks; psnr is the oracle's pairing (psnr_oracle_pairing), psnr_by_label the paper's.",
               "Plain SGD without augmentation: both attackers model the same client, so the plain-sgd rows are "
               "the modelled cells' (same_as_modelled = True), not a second run.",
               "The modelled attacker knows the optimizer but not the client's private order across epochs nor its "
               "augmentation draws (client_model says so: the answer is a lower bound); on a client of "
               "several epochs IG adds Dimitrov et al.'s per-epoch dummies and epoch prior (--epoch-prior), DLG "
               "does not."]
        + convergence_notes(cells.values()))


def _figures(ws: Workspace, rows: list[dict[str, Any]], grid: list[Client], cells: dict[Any, CellResult],
             attacks: list[str]) -> list[str]:
    """One line plot per factor (the worst case over the attacks, each attacker, and the leak-free
    baselines, at the design's clients that vary only that factor around BASE) and the
    reconstructions of the clients of K <= 16."""
    figures = []
    worst = [r for r in rows if r["attack"] == WORST]
    for field, levels in zip(FACTORS, (EPOCHS, LOCAL_DATA, tuple(OPTIMIZERS), AUGMENT), strict=True):
        pts = [BASE._replace(**{field: v}) for v in levels]
        if sum(p in grid for p in pts) < 2:
            continue

        def mean_of(value: str, attacker: str, p: Client) -> float | None:
            vals = [r[value] for r in worst if r["attacker"] == attacker and tuple(r[k] for k in KEY) == tuple(p)
                    and r.get(value) is not None]
            return sum(vals) / len(vals) if vals else None

        lines = {f"{a} attacker, by label": [mean_of("psnr_by_label", a, p) for p in pts] for a in ATTACKERS}
        lines.update({f"{a} attacker, oracle pairing": [mean_of("psnr", a, p) for p in pts] for a in ATTACKERS})
        lines["public prior image"] = [mean_of("prior_psnr", "modelled", p) for p in pts]
        name = f"psnr_vs_{field}.png"
        save_line_plot(ws.out / name, [str(v) for v in levels], lines, xlabel=field.replace("_", " "),
                       ylabel="PSNR (dB), worst case over the attacks",
                       title=f"around E={BASE.epochs}, K={BASE.local_data}, {BASE.optimizer}, aug {BASE.augment}")
        figures.append(name)
    groups = []
    for c in grid:
        if c.local_data > 16:
            continue
        shown = [(scored_title(f"{a}, modelled", cells[(*c, "modelled", a, 0)]), cells[(*c, "modelled", a, 0)])
                 for a in attacks if (*c, "modelled", a, 0) in cells]
        groups.append((f"E={c.epochs} K={c.local_data} {c.optimizer} {c.augment}", shown))
    if save_grids(ws.out / "reconstructions.png", groups):
        figures.append("reconstructions.png")
    return figures
