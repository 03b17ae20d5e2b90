"""Answers to the common mistakes before torch is imported: unknown names, data folders, input
and output paths; and the thread policy's note."""

from __future__ import annotations

from typing import Any, Sequence


def threads_for_busy_cpu(threads: int | None, device: str, nproc: int = 1) -> tuple[int | None, str | None]:
    """(threads, note) by the thread policy the Python API applies too (runtime.threads_for_run);
    the command prints the note after its results (never before: a bad input still ends in one
    error line). None: torch's own choice."""
    from ..runtime import threads_for_run

    return threads_for_run(threads, device, nproc)


def say(note: str | None) -> None:
    if note:
        print(f"note: {note}")


def check_names(*, model: str | None = None, data: str | None = None, defenses: Sequence[str] = (),
                attacks: Sequence[str] = (), text: bool = False, data_root: str | None = None) -> None:
    """Unknown names (with a "did you mean"), malformed defense specs and a data folder (or
    --data-root) that does not exist, answered before torch is imported; the data loader checks
    the folder's contents."""
    from ..catalog import check, check_defense

    for attack in attacks:
        check("text attack" if text else "attack", attack)
    if model is not None and ":" not in model:
        check("text model" if text else "model", model, "" if text else " or package.module:callable")
    for spec in defenses:
        check_defense(spec)   # its name and its values (gaussian:abc, prune:2), as defenses/spec.py does
    if not text and (data is not None or data_root is not None):
        check_data_folder(data, data_root)


def check_data_folder(data: str | None, root: str | None = None) -> None:
    """An image --data that is neither a source name nor an existing folder, or a --data-root that
    is not a folder, refused as data/sources.py's open_source refuses them (DataError, the same
    line), before torch is imported. What cannot be told without reading (a folder above that
    cannot be searched) is left to the loader."""
    import os
    import stat

    from ..catalog import SOURCES, unknown
    from ..errors import DataError
    from ..paths import one_line

    def kind(path: str) -> str | None:   # "dir", "file", "absent", or None: cannot tell
        try:
            return "dir" if stat.S_ISDIR(os.stat(os.path.expanduser(path)).st_mode) else "file"
        except FileNotFoundError:
            return "absent"
        except (OSError, ValueError):
            return None

    if root is not None and kind(root) in ("file", "absent"):
        raise DataError(f"no such folder: {one_line(os.path.expanduser(root))} (given as root)")
    if data is None or data.strip().lower() in SOURCES:
        return
    found = kind(data)
    if found == "file":
        raise DataError(f"{one_line(data)} is a file, not a folder of images or a known source name")
    if found == "absent":
        if any(c in data for c in "/.~" + os.sep):
            raise DataError(f"no such folder: {one_line(data)}")
        raise unknown("data source", data, SOURCES, ", or a path to an image folder")


def precheck(cfg: Any) -> None:
    """Answer the common mistakes in a run's config before torch is imported (it takes 2-3 s):
    unknown names (with a "did you mean"; the config model checks --server, server_spec.py), input files that cannot be read, an --out that
    cannot be written. Only what the user gave is checked (a name an --update file decides is
    checked when it is read); the pipeline checks everything again, this only answers fast."""
    from ..catalog import check
    from ..modalities import modality_named
    from ..paths import check_apart, check_input_file, check_output_dir, run_inputs

    given = cfg.model_fields_set
    modality = modality_named(cfg.modality)  # its names: the attacks and models of its own kind
    modality.check_names(attack=cfg.attack if "attack" in given else None,
                         model=cfg.model if "model" in given else None)
    check_names(data=cfg.data if "data" in given and modality.data_sources else None, defenses=cfg.defense,
                data_root=cfg.data_root if modality.data_sources else None)
    if cfg.preset is not None:
        check("preset", cfg.preset)
    for field in ("update", "truth", "checkpoint"):
        path = getattr(cfg, field)
        if path is not None:
            check_input_file(path, "--" + field)
    if cfg.out is not None:
        check_output_dir(cfg.out)
        check_apart([("--out", cfg.out)], run_inputs(cfg))
