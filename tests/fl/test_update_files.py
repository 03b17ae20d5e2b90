"""One update-file API for every modality (issue 58): the same save/load calls write and read an
image update and a text update (and their truths), the modality read from the file itself."""

import pytest
import torch

from gradleak.data import sample_batch
from gradleak.errors import UpdateFileError
from gradleak.fl import fedsgd
from gradleak.fl.files import load_truth, load_update, read_update_meta, save_truth, save_update
from gradleak.models import ModelSpec, build_model


@pytest.fixture(scope="module")
def image_case(cifar10):
    model = build_model("convnet", num_classes=10, width=8)
    batch = sample_batch(cifar10, 2, 0, image_size=32, channels=3)
    return fedsgd(model, batch, share_bn_statistics=True), batch


@pytest.fixture(scope="module")
def text_case():
    pytest.importorskip("tokenizers")
    from gradleak.text import build_text_model, text_batch
    from gradleak.text.client import text_fedsgd

    model = build_text_model("tiny-transformer", seed=0)
    batch = text_batch(["my pin is 4321", "hello there"], model, 2, 0)
    return text_fedsgd(model, batch), batch


def _same_update(a, b) -> None:
    assert a.meta == b.meta
    for mine, theirs in ((a.gradients, b.gradients), (a.global_weights, b.global_weights)):
        assert list(mine) == list(theirs)
        for k in mine:
            torch.testing.assert_close(mine[k], theirs[k], rtol=0, atol=0)
    assert set(a.bn_statistics) == set(b.bn_statistics)  # read back in the order of a set, as before
    for k, (mean, var) in a.bn_statistics.items():
        torch.testing.assert_close(torch.stack([mean, var]), torch.stack(b.bn_statistics[k]), rtol=0, atol=0)


def test_one_save_load_pair_round_trips_an_image_and_a_text_update(tmp_path, image_case, text_case):
    from gradleak.text import TextBatch, TextModel

    for name, (update, batch) in {"image": image_case, "text": text_case}.items():
        save_update(update, tmp_path / f"{name}.safetensors")
        save_truth(batch, tmp_path / f"{name}-truth.safetensors")
        loaded, model = load_update(tmp_path / f"{name}.safetensors")  # the file says which modality
        _same_update(loaded, update)
        assert read_update_meta(tmp_path / f"{name}.safetensors") == update.meta
        assert isinstance(model, ModelSpec if name == "image" else TextModel)
        truth = load_truth(tmp_path / f"{name}-truth.safetensors", loaded.meta, model=model)
        assert isinstance(truth, type(batch)) and truth.labels.tolist() == batch.labels.tolist()
        # saved again, the same file
        save_update(loaded, tmp_path / f"{name}-again.safetensors")
        assert (tmp_path / f"{name}-again.safetensors").stat().st_size == (tmp_path / f"{name}.safetensors").stat().st_size
        _same_update(load_update(tmp_path / f"{name}-again.safetensors")[0], update)
    assert image_case[0].bn_statistics and isinstance(truth, TextBatch)
    assert load_truth(tmp_path / "text-truth.safetensors").sentences == text_case[1].sentences  # from its format


def test_a_file_of_another_modality_is_refused_with_what_it_is(tmp_path, image_case, text_case):
    save_update(image_case[0], tmp_path / "image.safetensors")
    save_update(text_case[0], tmp_path / "text.safetensors")
    with pytest.raises(UpdateFileError, match="is an image update; attack it without --modality text"):
        load_update(tmp_path / "image.safetensors", modality="text")
    with pytest.raises(UpdateFileError, match=r"not a gradleak shared update \(format='gradleak.text-update'\)"):
        load_update(tmp_path / "text.safetensors", modality="image")
    save_truth(image_case[1], tmp_path / "truth.safetensors")
    with pytest.raises(UpdateFileError, match="is not a gradleak text truth file"):
        load_truth(tmp_path / "truth.safetensors", text_case[0].meta)


def test_each_modality_writes_its_own_format(tmp_path, image_case, text_case):
    """The files are those the modalities wrote before one API read them all (docs/reference/files.md)."""
    from safetensors import safe_open

    for name, (update, batch), formats in (("image", image_case, ("gradleak.shared-update", "gradleak.truth")),
                                           ("text", text_case, ("gradleak.text-update", "gradleak.text-truth"))):
        save_update(update, tmp_path / "u.safetensors")
        save_truth(batch, tmp_path / "t.safetensors")
        with safe_open(str(tmp_path / "u.safetensors"), "pt") as f:
            md = f.metadata()
            assert (md["format"], md["format_version"], set(md)) == (formats[0], "1", {"format", "format_version", "meta"})
            assert {k.partition("/")[0] for k in f.keys()} == ({"grad", "weights", "bn"} if name == "image"
                                                               else {"grad", "weights"})
        with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
            assert f.metadata()["format"] == formats[1]


def test_each_modality_declares_its_update_format_and_a_file_of_another_is_named(tmp_path):
    """The update format each modality's MODALITY_SPEC declares is the one its files are written in,
    and a text update attacked as an image one (the text modality never imported) is named: one
    line, exit 2, with the flag that attacks it."""
    import subprocess
    import sys

    from gradleak.fl.files import update_files
    from gradleak.modalities import MODALITIES
    from gradleak.text import client  # registers the text update files  # noqa: F401

    for name, modality in MODALITIES.items():
        assert modality.update_format == update_files(name).update_format, name
    upd = tmp_path / "t.safetensors"
    share = [sys.executable, "-m", "gradleak.cli", "share", "--modality", "text", "--text", "my pin is 4321",
             "--out", str(upd)]
    assert subprocess.run(share, capture_output=True, text=True, timeout=300).returncode == 0
    # a fresh process: only the image modality's modules are imported when the file is read
    done = subprocess.run([sys.executable, "-m", "gradleak.cli", "attack", "--update", str(upd), "--no-progress",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"gradleak: error: {upd} is a text update; attack it with --modality text")
    assert not (tmp_path / "r").exists()
