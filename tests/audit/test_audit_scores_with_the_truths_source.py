"""The server-side audit scores a client's update against the data set its truth comes from: the
recognisability evidence (IIP's pool, the source's own mean prior) is the truth's source's, not
the attack config's default source (cifar10-samples), and the client's guard, given the same
update and batch, finds the same evidence and the same verdict (issue 60: the guard called the
noised updates defended while the audit, scoring Fashion-MNIST truth against CIFAR-10 photos,
called 2 of 6 recognisable)."""

import json

import torch

from gradleak.audit import AuditSettings, FedAvgKeys, LeakageAuditor
from gradleak.audit.example import FederationSettings, build_example_model, client_batch, local_training
from gradleak.data import Batch, open_source
from gradleak.guard import GuardPolicy, guard_update
from gradleak.metrics.recognisable import candidate_pool, coarse_ssim, prior_image
from gradleak.pipeline.image import IIP_POOL

S = FederationSettings(rounds=1, clients=2, examples=1, local_steps=1, batch_size=1, lr=0.01, model="lenet-dlg",
                       image_size=28, data="fashion-mnist")
EVIDENCE = ("coarse_ssim", "prior_coarse_ssim", "source_prior_coarse_ssim", "public_prior_coarse_ssim",
            "identified", "identified_among", "recognisable")


def _round(batch):
    model = build_example_model(S)
    start = {k: v.clone() for k, v in model.module.state_dict().items()}
    local_training(model, batch, steps=1, batch_size=1, lr=S.lr, private_seed=0)
    return model, start, {k: v.clone() for k, v in model.module.state_dict().items()}


def _audited(tmp_path, batch, attack):
    model, start, trained = _round(batch)
    auditor = LeakageAuditor(build_example_model(S), AuditSettings(attack=attack, out=tmp_path / "audit"),
                             truth_fn=lambda rnd, client: batch)
    threat = auditor.threat({"local-steps": 1, "batch-size": 1, "lr": S.lr}, FedAvgKeys(), 1)
    row = auditor.audit(1, "0", start, trained, num_examples=1, threat=threat)
    metrics = json.loads((tmp_path / "audit" / row["run"] / "metrics.json").read_text())
    return auditor, auditor.shared_update(start, trained, num_examples=1, threat=threat), row, metrics


def test_the_audit_and_the_guard_judge_with_the_truths_source(tmp_path):
    batch = client_batch(S, 0, 1)
    assert batch.source == "fashion-mnist"
    _, update, row, audited = _audited(tmp_path, batch, {"attack": "rgap"})
    assert row["verdict"] == "leaked" and audited["data"] == "fashion-mnist"
    a = audited["per_image"][0]
    # the source prior is Fashion-MNIST's own mean (a centred garment), not CIFAR-10's photos' mean
    fashion = open_source("fashion-mnist")
    pool = torch.stack([fashion.load(i, 28, 1) for i in range(0, len(fashion), 600)])
    own = float(coarse_ssim(prior_image(pool), batch.images)[0])
    cifar = open_source("cifar10-samples")
    photos = torch.stack([cifar.load(i, 28, 1) for i in range(len(cifar))])
    other = float(coarse_ssim(prior_image(photos), batch.images)[0])
    assert abs(a["source_prior_coarse_ssim"] - own) < 0.05 and abs(own - other) > 0.1
    assert a["identified_among"] > IIP_POOL   # Fashion-MNIST's pool of IIP_POOL images, then the decoys
    # the client's guard, given the same update and batch, finds the same evidence and verdict
    result = guard_update(build_example_model(S), update, batch, GuardPolicy(attack="rgap", progress=False),
                          out=tmp_path / "guard", name="c0")
    guarded = json.loads((tmp_path / "guard" / result.record.checks[0].run / "metrics.json").read_text())
    assert guarded["verdict"] == audited["verdict"] == "leaked"
    assert {k: a[k] for k in EVIDENCE} == {k: guarded["per_image"][0][k] for k in EVIDENCE}


def test_a_truth_from_no_named_source_is_scored_against_the_public_decoys_only(tmp_path):
    named = client_batch(S, 0, 1)
    batch = Batch(images=named.images, labels=named.labels, names=named.names, source="my own photos",
                  class_names=named.class_names)
    _, update, row, audited = _audited(tmp_path, batch, {"attack": "rgap"})
    a = audited["per_image"][0]
    assert audited["data"] == "my own photos" and row["verdict"] == "leaked"
    # no source pool: the source prior is the flat fallback, never cifar10-samples' photos' mean
    assert a["source_prior_coarse_ssim"] == a["zero_coarse_ssim"]
    result = guard_update(build_example_model(S), update, batch, GuardPolicy(attack="rgap", progress=False),
                          out=tmp_path / "guard", name="c0")
    g = json.loads((tmp_path / "guard" / result.record.checks[0].run / "metrics.json").read_text())["per_image"][0]
    assert {k: a[k] for k in EVIDENCE} == {k: g[k] for k in EVIDENCE}
    assert a["identified_among"] <= len(candidate_pool(None, batch.images)) + len(batch.images)
