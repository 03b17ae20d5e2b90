"""A Flower federation whose clients guard their updates (gradleak.guard.flower.GuardMod): the
example federation of gradleak's Flower audit (Fashion-MNIST, LeNet, batch 1, FedAvg), its
ClientApp reused as it is, with the guard added in one line; the server audits what it actually
receives (AuditedStrategy). Loopback only (Flower's simulation engine on a local Ray).

    python examples/flower_guarded_app.py --policy noise --out guarded/
    python examples/flower_guarded_app.py --policy withhold --server trap --out trapped/

Writes DIR/guard.csv (one row per client per round: decision, verdict before and after, the
attack that decided, the noise, seconds), DIR/guard-runs/ (a run folder per check), DIR/audit/
(the server-side audit: audit.csv, runs/) and DIR/federation.json (accuracy per round, times).
Bad flags: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from gradleak.audit.example import FederationSettings, build_example_model, client_app, client_batch
from gradleak.data import open_source
from gradleak.errors import GradleakError
from gradleak.guard import GuardPolicy
from gradleak.guard.flower import GuardMod, guarded

#: Test images the server evaluates the global model on after every round (centralised evaluation).
EVAL_IMAGES = 500


def guarded_client_app(s: FederationSettings, policy: GuardPolicy, out: Path) -> Any:
    """The example's ClientApp with the guard around it (the one added line is ``guarded``)."""
    settings = dict(s.__dict__)

    def model_fn(msg: Any, context: Any) -> Any:
        return build_example_model(FederationSettings(**settings))

    def batch_fn(msg: Any, context: Any) -> Any:
        rnd = int(msg.content.config_records["config"]["server-round"])
        return client_batch(FederationSettings(**settings), int(context.node_config["partition-id"]), rnd)

    app = client_app(s)
    return guarded(app, GuardMod(policy, model_fn=model_fn, batch_fn=batch_fn, arch=s.model, out=out,
                                 data_root=s.data_root))


def evaluator(s: FederationSettings) -> Any:
    """Server-side evaluation: accuracy of the global model on EVAL_IMAGES test images."""
    import torch

    source = open_source(s.data, root=s.data_root, split="test")
    idx = list(range(min(EVAL_IMAGES, len(source))))
    c = source.native_channels
    images = torch.stack([source.load(i, s.image_size, c) for i in idx])
    labels = torch.tensor([source.label(i) for i in idx])

    def evaluate(server_round: int, arrays: Any) -> Any:
        from flwr.app import MetricRecord

        model = build_example_model(s)
        model.module.load_state_dict(arrays.to_torch_state_dict())
        model.module.eval()
        with torch.no_grad():
            pred = model.module(model.normalize(images)).argmax(1)
        return MetricRecord({"accuracy": float((pred == labels).float().mean())})

    return evaluate


def server_app(s: FederationSettings, auditor: Any, result: dict[str, Any]) -> Any:
    """FedAvg wrapped in the audit (as the audit example's), with server-side evaluation."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg

    from gradleak.audit.flower import AuditedStrategy

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        torch.set_num_threads(1)
        model = build_example_model(s)
        inner = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=s.clients,
                       min_available_nodes=s.clients)
        strategy = AuditedStrategy(inner, auditor) if auditor is not None else inner
        config = ConfigRecord({"lr": float(s.lr), "local-steps": int(s.local_steps),
                               "batch-size": int(s.batch_size or s.examples)})
        try:
            out = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.module.state_dict()),
                                 num_rounds=s.rounds, train_config=config, timeout=3600, evaluate_fn=evaluator(s))
            result["accuracy"] = {int(r): float(m["accuracy"]) for r, m in out.evaluate_metrics_serverapp.items()}
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            result["error"] = f"{type(exc).__name__}: {exc}"
            raise

    return app


def run_guarded(s: FederationSettings, policy: GuardPolicy | None, out: str | Path, *,
                audit_attack: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the federation (``policy`` None: unguarded clients) and return federation.json's record."""
    from flwr.simulation import run_simulation

    from gradleak.audit.auditor import AuditSettings, LeakageAuditor
    from gradleak.localray import local_ray

    s.check()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    auditor = None
    if audit_attack is not None:
        settings = AuditSettings(attack=dict(audit_attack), out=out / "audit", local_steps=s.local_steps,
                                 local_batch_size=s.batch_size, local_lr=s.lr, max_batch_size=max(64, s.examples),
                                 data_root=s.data_root)
        auditor = LeakageAuditor(build_example_model(s), settings,
                                 truth_fn=lambda rnd, client: client_batch(s, int(client), rnd))
    result: dict[str, Any] = {}
    clients = guarded_client_app(s, policy, out) if policy is not None else client_app(s)
    levels = {name: logging.getLogger(name).level for name in ("flwr", "ray")}
    for name in levels if not s.verbose else ():
        logging.getLogger(name).setLevel(logging.WARNING)
    t0 = time.perf_counter()
    try:
        with local_ray(s.ray_cpus or 2, keep_signals=True):
            run_simulation(server_app=server_app(s, auditor, result), client_app=clients, num_supernodes=s.clients,
                           backend_config={"client_resources": {"num_cpus": s.client_cpus, "num_gpus": 0.0}},
                           verbose_logging=s.verbose)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    record = {"federation": dict(s.__dict__), "policy": policy.to_dict() if policy is not None else None,
              "wall_seconds": round(time.perf_counter() - t0, 1), "accuracy": result.get("accuracy", {}),
              "audit": [dict(r) for r in auditor.rows] if auditor is not None else []}
    if auditor is not None:
        auditor.write_summary({"federation": dict(s.__dict__)})
    (out / "federation.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if "error" in result:
        raise GradleakError(f"the federation stopped: {result['error']}")
    return record


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line and exit 2, as gradleak's CLI answers a bad flag
        raise GradleakError(message)


def parse(argv: list[str] | None) -> tuple[FederationSettings, GuardPolicy | None, Path, dict[str, Any]]:
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", choices=("report", "withhold", "noise", "none"), default="noise",
                   help="the guard's policy (none: unguarded clients)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--server", default="honest", help="honest | trap | imprint (gradleak's malicious servers)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--budget", type=float, default=600.0, help="the guard's seconds per client-round")
    p.add_argument("--iterations", type=int, default=100, help="each optimisation attack's steps (guard and audit)")
    p.add_argument("--schedule", default="0.3,1,3,10", help="noise multipliers z, comma-separated, increasing")
    p.add_argument("--audit-attack", default="auto", help="the server-side audit's attack")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--verbose", action="store_true", help="Flower's and Ray's log")
    a = p.parse_args(argv)
    s = FederationSettings(rounds=a.rounds, clients=a.clients, examples=1, local_steps=1, lr=0.01, model="lenet-dlg",
                           server=a.server, image_size=28, data="fashion-mnist", ray_cpus=2, verbose=a.verbose)
    s.check()
    try:
        schedule = tuple(float(z) for z in a.schedule.split(","))
    except ValueError:
        raise GradleakError(f"--schedule {a.schedule!r}: give comma-separated numbers") from None
    policy = None if a.policy == "none" else GuardPolicy(action=a.policy, budget_seconds=a.budget,
                                                         iterations=a.iterations, schedule=schedule,
                                                         progress=not a.no_progress)
    return s, policy, Path(a.out), {"attack": a.audit_attack, "iterations": a.iterations}


def main(argv: list[str] | None = None) -> int:
    try:
        s, policy, out, audit = parse(argv)
        record = run_guarded(s, policy, out, audit_attack=audit)
    except GradleakError as exc:
        print(f"flower_guarded_app: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    leaked = [r for r in record["audit"] if r.get("verdict") == "leaked"]
    print(f"{out}: {len(record['audit'])} updates reached the server, {len(leaked)} leaked; accuracy "
          f"{record['accuracy']}; guard decisions in {out / 'guard.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
