"""Calibration of the "recognisable" rule (outcome.recognisable_row) and the text "set of words" line.

Images: a folder of 6 classes of scikit-image photos at 32 px, 3 crops each (the newcomer's case),
and scikit-learn's china / flower photos (never tuned on), iDLG on the DLG LeNet (what auto ran in
the newcomer's runs), one photo per run through ``gradleak attack`` as a user runs it:

* must be leaked: Gaussian 1e-2 (the cameraman at ~13 dB, the retina at SSIM ~0.2);
* must not be leaked: Gaussian 0.1, DP-SGD (clip 1, noise 1), random starts (``--iterations 0``);
* answers scored without a run, on every photo: the zero image, the public prior image, uniform
  noise, and the truth plus Gaussian pixel noise (std 0.1 / 0.2 / 0.3: recognisable to the eye).

Text: what random token answers (uniform over MiniLM's vocabulary, as many as the truth's tokens)
and a fixed generic sentence score in token-set precision / recall on the newcomer's sentences.

    .venv/bin/python benchmarks/recognisable.py   # one thread: 4 min of CPU (12 min wall on a busy 2-core machine)

Writes benchmarks/recognisable.json (every case, every image) and prints the table.
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
SKIMAGE = ("astronaut", "camera", "chelsea", "coffee", "retina", "rocket")
SENTENCES = ("my landlord raised the rent again in march", "the biopsy results came back negative")
GENERIC = "the results of the meeting were sent to me again in the morning"


def build_folder(root: Path, names: tuple[str, ...]) -> Path:
    """An ImageFolder at ``root``: one class per photo, 3 square crops each (top-left, centre,
    bottom-right at 80 %), 32 px."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    sk = {Path(f).stem: im for im, f in zip(load_sample_images().images, load_sample_images().filenames)}
    for name in names:
        img = sk[name] if name in sk else getattr(data, name)()
        img = img[..., :3] if img.ndim == 3 else np.stack([img] * 3, -1)
        h, w = img.shape[:2]
        s, s2 = min(h, w), int(min(h, w) * 0.8)
        crops = [(0, 0, s), ((h - s) // 2, (w - s) // 2, s), (h - s2, w - s2, s2)]
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for j, (t, left, side) in enumerate(crops):
            crop = np.ascontiguousarray(img[t:t + side, left:left + side]).astype(np.uint8)
            Image.fromarray(crop).resize((32, 32), Image.BICUBIC).save(folder / f"{name}_{j}.png")
    return root


def run_case(folder: Path, index: int, flags: list[str], out: Path) -> dict:
    from gradleak.cli import main as gradleak

    argv = ["attack", "--attack", "idlg", "--data", str(folder), "--indices", str(index), "--threads", "1",
            "--no-progress", "--out", str(out), *flags]
    t = time.time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert gradleak(argv) == 0, argv
    m = json.loads((out / "metrics.json").read_text())
    keys = ("name", "psnr", "zero_psnr", "ssim", "coarse_ssim", "zero_coarse_ssim", "prior_coarse_ssim", "identified",
            "identified_among", "recognisable", "recognisable_reason")
    return {"flags": flags, "index": index, "verdict": m["verdict"], "reason": m["verdict_reason"],
            "seconds": round(time.time() - t, 1), "images": [{k: r.get(k) for k in keys} for r in m["per_image"]]}


def static_answers(folder: Path) -> list[dict]:
    """Answers that need no run, scored on every photo of ``folder`` as the pipeline scores a run."""
    from gradleak.data import batch_of, open_source
    from gradleak.metrics import ssim
    from gradleak.metrics.recognisable import candidate_pool, prior_image, public_decoys, recognisability
    from gradleak.models import build_model
    from gradleak.outcome import recognisable_row

    source = open_source(str(folder))
    truth = batch_of(source, list(range(len(source))), 32, 3).images
    model = build_model("lenet-dlg", num_classes=10, channels=3, image_size=32, seed=0)
    zero = model.denormalize(torch.zeros_like(truth[:1])).clamp(0, 1)
    gen = torch.Generator().manual_seed(0)
    answers = {"zero image": zero.expand_as(truth), "public prior image": prior_image(public_decoys(32, 3)).expand_as(truth),
               "uniform noise": torch.rand(truth.shape, generator=gen)}
    for std in (0.1, 0.2, 0.3):
        answers[f"truth + noise {std}"] = (truth + std * torch.randn(truth.shape, generator=gen)).clamp(0, 1)
    rows = []
    for what, answer in answers.items():
        for i in range(len(source)):
            others = torch.cat([truth[:i], truth[i + 1:]])   # the folder's other photos: the source pool
            row = recognisability(answer[i:i + 1], truth[i:i + 1], zero, candidate_pool(others, truth[i:i + 1]))[0]
            row.update(name=source.item_name(i), ssim=float(ssim(answer[i:i + 1], truth[i:i + 1])[0]))
            why = recognisable_row(row)
            rows.append({"answer": what, **row, "recognisable": bool(why)})
    return rows


def text_baselines() -> list[dict]:
    from gradleak.text.metrics import token_set_scores
    from gradleak.text.models import wordpiece_tokenizer

    tok = wordpiece_tokenizer()   # MiniLM's
    truth = [[i for i in tok.encode(s) if i not in tok.special_ids] for s in SENTENCES]
    n = sum(len(t) for t in truth)
    gen = torch.Generator().manual_seed(0)
    out = []
    vocab = tok.vocab_size
    for trial in range(20):
        ids = [int(i) for i in torch.randint(1000, vocab, (n,), generator=gen)]
        p, r = token_set_scores(truth, [ids])
        out.append({"answer": f"random tokens {trial}", "precision": p, "recall": r})
    generic = [i for i in tok.encode(GENERIC) if i not in tok.special_ids]
    p, r = token_set_scores(truth, [generic])
    out.append({"answer": f"generic sentence: {GENERIC}", "precision": p, "recall": r})
    return out


def main() -> None:
    torch.set_num_threads(1)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        photos = build_folder(Path(tmp) / "photos", SKIMAGE)
        unseen = build_folder(Path(tmp) / "unseen", ("china", "flower"))
        # sorted classes: astronaut 0-2, camera 3-5, chelsea 6-8, coffee 9-11, retina 12-14, rocket 15-17
        plan = [(photos, 4, ["--defense", "gaussian:1e-2"]), (photos, 13, ["--defense", "gaussian:1e-2"]),
                (photos, 7, ["--defense", "gaussian:1e-2"]), (unseen, 1, ["--defense", "gaussian:1e-2"]),
                (unseen, 4, ["--defense", "gaussian:1e-2"]),
                (photos, 4, ["--defense", "gaussian:0.1"]), (photos, 13, ["--defense", "gaussian:0.1"]),
                (unseen, 1, ["--defense", "gaussian:0.1"]), (photos, 4, ["--defense", "dpsgd:clip=1,noise=1"]),
                (photos, 13, ["--defense", "dpsgd:clip=1,noise=1"]),
                (photos, 4, ["--iterations", "0"]), (photos, 13, ["--iterations", "0"]), (unseen, 4, ["--iterations", "0"])]
        for k, (folder, index, flags) in enumerate(plan):
            runs.append({"data": folder.name, **run_case(folder, index, flags, Path(tmp) / f"run{k}")})
            r = runs[-1]
            im = r["images"][0]
            print(f"{r['data']:7s} {im['name']:22s} {' '.join(flags):34s} {r['verdict']:12s} psnr {im['psnr']:5.1f} "
                  f"(zero {im['zero_psnr']:4.1f}) ssim {im['ssim']:.2f} coarse {im['coarse_ssim']:.2f} "
                  f"(zero {im['zero_coarse_ssim']:.2f}, prior {im['prior_coarse_ssim']:.2f}) "
                  f"ident {im['identified']}/{im['identified_among']} {r['seconds']} s", flush=True)
        static = static_answers(photos) + static_answers(unseen)
    for what in dict.fromkeys(r["answer"] for r in static):
        rows = [r for r in static if r["answer"] == what]
        print(f"{what:20s} recognisable {sum(r['recognisable'] for r in rows)}/{len(rows)}  coarse SSIM "
              f"max {max(r['coarse_ssim'] for r in rows):.2f} min {min(r['coarse_ssim'] for r in rows):.2f}  "
              f"identified {sum(bool(r['identified']) for r in rows)}")
    text = text_baselines()
    best = max(text[:-1], key=lambda r: r["precision"])
    print(f"text: random tokens: precision max {best['precision']:.2f}; generic sentence: precision "
          f"{text[-1]['precision']:.2f}, recall {text[-1]['recall']:.2f}")
    result = {"command": "gradleak attack --attack idlg --data PHOTOS --indices I --threads 1 [flags]",
              "cpu": platform.processor() or platform.machine(), "runs": runs, "static": static, "text": text}
    (HERE / "recognisable.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
