"""Issue 15, sweeps / dashboard / run reports: hostile files and paths, by family.

Families: sweep spec parsing (duplicate keys at any depth, deep nesting, alias and merge-key
expansion, random bytes and random structures, inputs that are not regular files); the sweep's
--out (a file, below a file, a link, ``.``, non-UTF-8, a foreign folder, sweep files that are not
what they claim); a damaged results store (bad rows by column and type, foreign schemas, random,
truncated and flipped files) met by both ``gradleak sweep`` (resume) and ``gradleak dashboard``;
the dashboard's --out (never one of the folder's files, never anything but an earlier page) and
audit.csv (ragged, non-numeric, not a file); run reports (metrics.json deep or ill-typed,
report.html that cannot be replaced, planted links at temporary names, the staging-name subtitle).

Every hostile case ends in exit status 2 with exactly one line ``gradleak: error: ...``, within
seconds, with every file that existed before byte-identical afterwards and nothing added, and
(for a sweep) before any cell runs.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import gradleak.sweep.engine as engine
from gradleak.cli import main
from gradleak.errors import ConfigError, GradleakError
from gradleak.sweep import ResultStore, load_spec, parse_spec
from gradleak.sweep.spec import MAX_CELLS, MAX_SPEC_DEPTH, MAX_SPEC_ITEMS, loads_spec_text

# A hang (a FIFO read, an alias bomb) fails the test here; timings belong in benchmarks/.
pytestmark = pytest.mark.timeout(180)
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ROOT = os.geteuid() == 0
BASE = {"attack": "dlg", "model": "lenet-dlg", "iterations": 5, "paper_metrics": False, "threads": 1}
FIELDS = ["attack", "model", "seed", "batch_size", "defense", "iterations", "lr", "data"]


# ------------------------------------------------------------------ helpers
def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every entry below ``roots`` (not following links): kind and bytes / link target."""
    out: dict[str, tuple] = {}
    for root in roots:
        if not os.path.lexists(root):
            continue
        entries = [Path(root)]
        for dirpath, dirnames, filenames in os.walk(root):
            entries += [Path(dirpath) / n for n in dirnames + filenames]
        for p in entries:
            st_ = os.lstat(p)
            if stat.S_ISLNK(st_.st_mode):
                out[str(p)] = ("link", os.readlink(p))
            elif stat.S_ISREG(st_.st_mode):
                out[str(p)] = ("file", p.read_bytes(), stat.S_IMODE(st_.st_mode))
            elif stat.S_ISDIR(st_.st_mode):
                out[str(p)] = ("dir", stat.S_IMODE(st_.st_mode))
            else:
                out[str(p)] = ("other", st_.st_mode)
    return out


def run_cli(args, capsys) -> tuple[int, list[str]]:
    try:
        code = main([os.fspath(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def expect_clean_error(args, capsys, *roots: Path, contains: str | None = None) -> str:
    """Exit 2, one line ``gradleak: error: ...``, nothing below ``roots`` changed or added.
    Returns the line. (A hang fails the module's timeout; timings belong in benchmarks/.)"""
    before = snapshot(*roots)
    code, lines = run_cli(args, capsys)
    assert code == 2, (args, code, lines)
    assert len(lines) == 1 and lines[0].startswith("gradleak: error:"), lines
    assert snapshot(*roots) == before, "a file was changed, added or removed"
    if contains is not None:
        assert contains in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a sweep starts running cells: the error must come before any work."""
    calls = []

    def spy(cells, *args, **kwargs):
        cells = list(cells)
        calls.append(cells)
        if cells:
            raise AssertionError("cells ran although the problem was visible before them")
        return iter(())

    monkeypatch.setattr(engine, "run_cells", spy)
    return calls


def make_sweep(folder: Path, cells: int = 3) -> Path:
    """A sweep folder as `gradleak sweep` leaves it (store with ok and failed cells, results.csv,
    .sweep.lock), without running an attack."""
    spec = parse_spec({"base": BASE, "grid": {"seed": list(range(cells))}})
    with ResultStore(folder) as store:
        store.record_sweep(spec.to_dict(), "inline", 1, len(spec.cells), len(spec.cells))
        for i, cell in enumerate(spec.cells):
            if i % 2 == 0:
                result = {"status": "ok", "metrics": {"psnr_mean": 10.0 + i, "label_accuracy": 1.0, "iip": 0.5,
                                                      "per_image": [{"index": 0, "psnr": 10.0}]},
                          "wall_seconds": 0.5, "worker": "w:1"}
            else:
                result = {"status": "failed", "error": "ConfigError: nope", "wall_seconds": 0.1, "worker": "w:1"}
            store.add(cell.cell_id, cell.grid, cell.config, result)
        store.write_csv([c.cell_id for c in spec.cells])
    (folder / ".sweep.lock").touch()
    return folder


def spec_file(tmp_path: Path, cells: int = 3) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(f"base: {json.dumps(BASE)}\ngrid:\n  seed: {list(range(cells))}\n")
    return p


def deny_writes_as_root(monkeypatch, folder: Path) -> None:
    """The folder is chmod 555; root could still write in it, so for root the access check that
    gradleak makes up front is told the truth a normal user would get."""
    if not ROOT:
        return
    real = os.access

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and os.path.realpath(path) == os.path.realpath(folder):
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def fresh(tmp_path: Path) -> Path:
    """A new empty folder per hypothesis example (tmp_path is shared by all examples of a test)."""
    import tempfile

    return Path(tempfile.mkdtemp(dir=tmp_path))


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def make_not_a_file(path: Path, kind: str, size: int) -> bool:
    """Put at ``path`` something that is not a readable small file: a folder, /dev/zero, a FIFO,
    or a sparse file of ``size`` bytes. False when ``kind`` is none of these."""
    if kind == "folder":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        fifo(path)
    elif kind == "too-large":
        with open(path, "wb") as fh:
            fh.truncate(size)        # sparse: no disk used
    else:
        return False
    return True


# ================================================================== sweep spec: parsers
def _nest(inner: str, kinds: list[str]) -> str:
    for kind in kinds:
        inner = f"[{inner}]" if kind == "seq" else f'{{"k": {inner}}}'
    return inner


@SETTINGS
@given(key=st.one_of(st.sampled_from(FIELDS),       # any text YAML can hold (it refuses control characters)
                    st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cn")), min_size=1, max_size=12)),
       kinds=st.lists(st.sampled_from(["seq", "map"]), max_size=6),
       where=st.sampled_from(["top", "base", "grid", "grid-value"]),
       others=st.integers(0, 3), json_style=st.booleans())
def test_duplicate_key_at_any_depth_is_refused(key, kinds, where, others, json_style, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    q = json.dumps(key, ensure_ascii=json_style)   # YAML does not join escaped surrogate pairs; JSON does
    filler = ", ".join(f'"other{i}": {i}' for i in range(others))
    dup = "{" + ", ".join(x for x in (f"{q}: 1", filler, f"{q}: 2") if x) + "}"
    nested = _nest(dup, kinds)
    if where == "top":
        doc = f'{{{q}: 1, "grid": {{"seed": [0]}}, {q}: 2}}' if json_style else f"{q}: 1\ngrid: {{seed: [0]}}\n{q}: 2\n"
    elif where == "base":
        doc = (f'{{"base": {nested}, "grid": {{"seed": [0]}}}}' if json_style
               else f"base: {nested}\ngrid: {{seed: [0]}}\n")
    elif where == "grid":
        doc = f'{{"grid": {nested}}}' if json_style else f"grid: {nested}\n"
    else:
        doc = f'{{"grid": {{"defense": [{nested}]}}}}' if json_style else f"grid:\n  defense:\n    - {nested}\n"
    path = tmp_path / ("s.json" if json_style else "s.yaml")
    path.write_text(doc, encoding="utf-8")
    with pytest.raises(ConfigError, match="duplicate key") as err:
        load_spec(path)
    assert "\n" not in str(err.value)
    if key in FIELDS:
        assert repr(key) in str(err.value)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains="duplicate key")


def test_duplicate_keys_in_block_style_and_legit_repeats(tmp_path):
    for doc in ("base:\n  attack: dlg\n  seed: 1\n  attack: idlg\ngrid:\n  seed: [0]\n",
                "grid:\n  seed: [0]\ngrid:\n  seed: [1]\n",
                "base: {attack: dlg}\ngrid:\n  batch_size: [1]\n  seed: [0]\n  batch_size: [2]\n",
                "grid: {seed: [0]}\nbase: {1: a, 0x1: b}\n"):          # equal once parsed (1 == 0x1)
        with pytest.raises(ConfigError, match="duplicate key"):
            loads_spec_text(doc)
    # the same key in two different mappings is not a duplicate
    spec = parse_spec(loads_spec_text("base: {attack: dlg, model: lenet-dlg}\ngrid: {seed: [0, 1], model_seed: [0]}\n"))
    assert len(spec.cells) == 2


@SETTINGS
@given(depth=st.one_of(st.integers(MAX_SPEC_DEPTH + 1, MAX_SPEC_DEPTH + 50), st.integers(500, 100_000)),
       kind=st.sampled_from(["flow-seq", "flow-map", "json-map", "block-seq"]),
       where=st.sampled_from(["doc", "base", "grid"]))
def test_deep_nesting_is_refused_quickly(depth, kind, where, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    if kind == "flow-seq":
        inner = "[" * depth + "]" * depth
    elif kind == "flow-map":
        inner = "{a: " * depth + "1" + "}" * depth
    elif kind == "json-map":
        inner = '{"a": ' * depth + "1" + "}" * depth
    else:  # block sequences in compact form: "- - - x"
        inner = "\n  " + "- " * depth + "x"
    doc = {"doc": inner + "\n", "base": f"base: {inner}\ngrid: {{seed: [0]}}\n",
           "grid": f"grid:\n  seed: {inner}\n"}[where]
    if kind == "block-seq" and where == "doc":
        doc = "- " * depth + "x\n"
    path = tmp_path / "deep.yaml"
    path.write_text(doc)
    with pytest.raises(ConfigError, match="nested more than"):
        load_spec(path)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains="nested more than")


@SETTINGS
@given(depth=st.one_of(st.integers(MAX_SPEC_DEPTH + 1, 900), st.integers(1000, 200_000)),
       kind=st.sampled_from(["list", "object"]), where=st.sampled_from(["doc", "base", "grid"]))
def test_deep_nesting_in_a_json_spec(depth, kind, where, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    inner = "[" * depth + "]" * depth if kind == "list" else '{"a": ' * depth + "1" + "}" * depth
    doc = {"doc": inner, "base": '{"base": ' + inner + ', "grid": {"seed": [0]}}',
           "grid": '{"grid": {"seed": ' + inner + "}}"}[where]
    path = tmp_path / "deep.json"
    path.write_text(doc)
    with pytest.raises(ConfigError, match="nested more than"):
        load_spec(path)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains="nested more than")


def test_json_spec_is_read_as_json(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"base": {"attack": "dlg", "data": "caf\\u00e9 \\ud83d\\ude00"}, "grid": {"seed": [0, 1]}}')
    assert [c.config["data"] for c in load_spec(path).cells] == ["caf\u00e9 \U0001F600"] * 2
    path.write_text('{"base": {}, "grid": {"seed": [0]}, "base": {}}')
    with pytest.raises(ConfigError, match="duplicate key 'base'"):
        load_spec(path)
    path.write_text('{"grid": {"seed": [0]}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_spec(path)


def test_moderate_nesting_still_parses():
    value = loads_spec_text("a: " + "[" * 20 + "]" * 20 + "\n")["a"]
    for _ in range(19):
        value = value[0]
    assert value == []


@SETTINGS
@given(levels=st.integers(2, 14), fanout=st.integers(2, 12), where=st.sampled_from(["top", "base", "grid"]))
def test_alias_expansion_is_bounded(levels, fanout, where, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    lines = ["x0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    for i in range(1, levels):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]")
    anchors = "\n".join(lines)
    last = f"*a{levels - 1}"
    if where == "top":
        doc = f"{anchors}\nbase: {{}}\ngrid: {{seed: [0]}}\n"
    else:
        body = "{" + anchors.replace("\n", ", ").replace(": &", ": &") + "}"
        doc = (f"description: ''\nanchors: {body}\n" + (f"base: {{defense: {last}}}\ngrid: {{seed: [0]}}\n"
                                                          if where == "base" else f"grid: {{defense: {last}}}\n"))
    expanded = sum(fanout ** k for k in range(1, levels + 1))
    path = tmp_path / "bomb.yaml"
    path.write_text(doc)
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    if expanded > 2 * MAX_SPEC_ITEMS:
        assert "more than" in str(err.value)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path)


@pytest.mark.parametrize("doc, message", [
    ("a: &a [*a]\ngrid: {seed: [0]}\n", "nested more than"),                      # self-referencing list
    ("a: &a {b: *a}\ngrid: {seed: [0]}\n", "nested more than"),                   # self-referencing map
    ("a: &a {attack: dlg}\nbase: {<<: *a}\ngrid: {seed: [0]}\n", "merge key"),     # merge keys refused
    ("base: {<<: [{attack: dlg}, {attack: idlg}]}\ngrid: {seed: [0]}\n", "merge key"),
    ("grid: {seed: [" + "9" * 5000 + "]}\n", "not valid YAML"),                   # int beyond Python's limit
    ("grid: {seed: [2001-02-30]}\n", "not valid YAML"),                            # a date that does not exist
    ("grid: {seed: [!!python/object:os.system x]}\n", "not valid YAML"),          # unsafe tag
    ("grid: {seed: [0]}\n---\ngrid: {seed: [1]}\n", "not valid YAML"),             # two documents
    ("grid: {seed: [0]}\n\x00\n", "not valid YAML"),                               # control character
    ("grid: {seed: [0]\n", "not valid YAML"),                                      # unterminated
    ("grid: {? [a, b] : [0]}\n", "not valid YAML"),                                # unhashable key
])
def test_spec_syntax_family(doc, message, tmp_path, capsys, no_work):
    path = tmp_path / "s.yaml"
    path.write_text(doc)
    with pytest.raises(ConfigError, match=message):
        load_spec(path)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains=message)


@pytest.mark.parametrize("field", ["lr", "local_lr", "iterations", "seed", "defense"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999"])
@pytest.mark.parametrize("where", ["base", "grid"])
def test_non_finite_numbers_in_spec(field, value, where, tmp_path, capsys, no_work):
    path = tmp_path / "s.yaml"
    if where == "base":
        path.write_text(f"base: {{{field}: {value}}}\ngrid: {{seed: [0]}}\n" if field != "seed" else
                        f"base: {{{field}: {value}}}\ngrid: {{batch_size: [1]}}\n")
    else:
        path.write_text(f"grid: {{{field}: [1, {value}]}}\n")
    with pytest.raises(ConfigError, match=field):
        load_spec(path)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains=field)


def test_huge_grid_is_refused_before_validation(tmp_path):
    side = int(MAX_CELLS ** 0.5) + 2
    with pytest.raises(ConfigError, match="cells is more than"):
        parse_spec({"base": BASE, "grid": {"seed": list(range(side)), "model_seed": list(range(side))}})


@SETTINGS
@given(data=st.binary(max_size=400))
def test_random_bytes_as_spec(data, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_bytes(data)
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path)


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=8),
              st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 2**63])),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)), children,
                                               max_size=4)),
    max_leaves=20)


@settings(SETTINGS, max_examples=60)
@given(raw=st.one_of(_json_values,
                     st.fixed_dictionaries({"grid": st.dictionaries(st.sampled_from(FIELDS), _json_values, max_size=3)},
                                           optional={"base": st.dictionaries(st.sampled_from(FIELDS), _json_values,
                                                                             max_size=3)})))
def test_random_structures_as_spec_are_a_spec_or_one_config_error(raw):
    try:
        spec = parse_spec(raw)
    except ConfigError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1200
    else:
        assert spec.cells and all(len(c.cell_id) == 16 for c in spec.cells)


@pytest.mark.parametrize("kind, message", [
    ("folder", "is a folder"), ("dev-zero", "not a regular file"), ("fifo", "not a regular file"),
    ("absent", "does not exist"), ("dangling-link", "does not exist"), ("latin-1", "not UTF-8"),
    ("too-large", "bytes; at most"), ("empty", "must be a mapping"),
])
def test_spec_that_is_not_a_readable_file(kind, message, tmp_path, capsys, no_work):
    path = tmp_path / "spec.yaml"
    if make_not_a_file(path, kind, 64 * 1024 * 1024):
        pass
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "latin-1":
        path.write_bytes("base: {data: caf\xe9}\ngrid: {seed: [0]}\n".encode("latin-1"))
    elif kind == "empty":
        path.write_bytes(b"")
    expect_clean_error(["sweep", path, "--out", tmp_path / "out"], capsys, tmp_path, contains=message)


# ================================================================== sweep --out
def _out_case(kind: str, tmp_path: Path) -> tuple[list, str]:
    """(extra CLI args, expected text) with the --out path for ``kind`` prepared in tmp_path."""
    user = tmp_path / "user.txt"
    user.write_text("precious")
    sweep = make_sweep(tmp_path / "sw")
    if kind == "regular-file":
        return ["--out", user], "is a file"
    if kind == "below-file":
        return ["--out", user / "sub"], "is a file, not a folder"
    if kind == "symlink-to-empty":
        (tmp_path / "empty").mkdir()
        (tmp_path / "lnk").symlink_to(tmp_path / "empty")
        return ["--out", tmp_path / "lnk"], "symbolic link"
    if kind == "symlink-to-sweep":
        (tmp_path / "lnk").symlink_to(sweep)
        return ["--out", tmp_path / "lnk"], "symbolic link"
    if kind == "dangling-symlink":
        (tmp_path / "lnk").symlink_to(tmp_path / "nowhere")
        return ["--out", tmp_path / "lnk"], "symbolic link"
    if kind == "dot":
        return ["--out", "."], "folder reference"
    if kind == "dotdot":
        return ["--out", ".."], "folder reference"
    if kind == "dot-in-sweep":
        os.chdir(sweep)
        return ["--out", "."], "folder reference"
    if kind == "empty-string":
        return ["--out", ""], "folder"
    if kind == "non-utf8-new":
        return ["--out", os.fsdecode(b"sw\xff")], "not valid UTF-8"
    if kind == "non-utf8-existing":
        os.mkdir(os.fsencode(tmp_path) + b"/sw\xfe")
        (Path(os.fsdecode(os.fsencode(tmp_path) + b"/sw\xfe")) / "results.sqlite").write_bytes(b"")
        return ["--out", os.fsdecode(os.fsencode(tmp_path) + b"/sw\xfe")], "not valid UTF-8"
    if kind == "foreign-folder":
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / "notes.txt").write_text("mine")
        return ["--out", tmp_path / "home"], "holds other files"
    if kind == "folder-with-only-runs":     # e.g. a project folder holding gradleak attack's runs/
        (tmp_path / "proj" / "runs" / "0123456789abcdef").mkdir(parents=True)
        return ["--out", tmp_path / "proj", "--save-runs"], "holds other files"
    if kind == "store-is-folder":
        (sweep / "results.sqlite").unlink()
        (sweep / "results.sqlite").mkdir()
        return ["--out", sweep], "is a folder"
    if kind == "store-is-fifo":
        (sweep / "results.sqlite").unlink()
        fifo(sweep / "results.sqlite")
        return ["--out", sweep], "not a regular file"
    if kind == "store-is-dev-zero":
        (sweep / "results.sqlite").unlink()
        (sweep / "results.sqlite").symlink_to("/dev/zero")
        return ["--out", sweep], "symbolic link"
    if kind == "store-is-link-to-user-store":
        other = make_sweep(tmp_path / "other")
        (sweep / "results.sqlite").unlink()
        (sweep / "results.sqlite").symlink_to(other / "results.sqlite")
        return ["--out", sweep], "symbolic link"
    if kind == "csv-is-folder":
        (sweep / "results.csv").unlink()
        (sweep / "results.csv").mkdir()
        return ["--out", sweep], "results.csv is not a regular file"
    if kind == "csv-is-link-to-user-file":
        (sweep / "results.csv").unlink()
        (sweep / "results.csv").symlink_to(user)
        return ["--out", sweep], "results.csv is not a regular file"
    if kind == "lock-is-link-to-user-file":
        (sweep / ".sweep.lock").unlink()
        (sweep / ".sweep.lock").symlink_to(user)
        return ["--out", sweep], ".sweep.lock is not a regular file"
    if kind == "lock-is-dangling-link":
        (sweep / ".sweep.lock").unlink()
        (sweep / ".sweep.lock").symlink_to(tmp_path / "created-by-open")
        return ["--out", sweep], ".sweep.lock is not a regular file"
    if kind == "journal-is-folder":
        (sweep / "results.sqlite-journal").mkdir()
        return ["--out", sweep], "results.sqlite-journal is not a regular file"
    if kind == "runs-is-file":
        (sweep / "runs").write_text("x")
        return ["--out", sweep, "--save-runs"], "runs is not a folder"
    if kind == "runs-is-link":
        (tmp_path / "elsewhere").mkdir()
        (sweep / "runs").symlink_to(tmp_path / "elsewhere")
        return ["--out", sweep, "--save-runs"], "runs is not a folder"
    if kind == "unwritable-new":
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o555)
        return ["--out", tmp_path / "ro" / "sw"], "not writable"
    if kind == "unwritable-existing":
        os.chmod(sweep, 0o555)
        return ["--out", sweep], "not writable"
    raise AssertionError(kind)


OUT_KINDS = ["regular-file", "below-file", "symlink-to-empty", "symlink-to-sweep", "dangling-symlink", "dot", "dotdot",
             "dot-in-sweep", "empty-string", "non-utf8-new", "non-utf8-existing", "foreign-folder",
             "folder-with-only-runs", "store-is-folder",
             "store-is-fifo", "store-is-dev-zero", "store-is-link-to-user-store", "csv-is-folder",
             "csv-is-link-to-user-file", "lock-is-link-to-user-file", "lock-is-dangling-link", "journal-is-folder",
             "runs-is-file", "runs-is-link", "unwritable-new", "unwritable-existing"]


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_sweep_out_that_could_only_fail_is_refused_before_any_cell(kind, tmp_path, capsys, no_work, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = spec_file(tmp_path)
    args, message = _out_case(kind, tmp_path)
    if kind.startswith("unwritable"):
        deny_writes_as_root(monkeypatch, tmp_path / ("ro" if kind == "unwritable-new" else "sw"))
    try:
        expect_clean_error(["sweep", spec, "--executor", "inline", "--no-progress", *args], capsys, tmp_path,
                           contains=message)
    finally:
        for p in (tmp_path / "ro", tmp_path / "sw"):
            if p.exists():
                os.chmod(p, 0o755)
    assert not no_work or no_work == [[]]


def test_sweep_out_accepts_an_earlier_sweep_folder(tmp_path, capsys, no_work, monkeypatch):
    spec = spec_file(tmp_path)
    sweep = make_sweep(tmp_path / "sw")
    monkeypatch.chdir(tmp_path)
    for out in (sweep, str(sweep) + "/", "sw"):     # all cells finished: nothing runs
        code, lines = run_cli(["sweep", spec, "--out", out, "--executor", "inline", "--no-progress"], capsys)
        assert code == 0, lines
    assert no_work == [[], [], []]


@pytest.mark.parametrize("kind", ["new", "new-below-new", "empty"])
def test_sweep_out_accepts_new_and_empty_folders(kind, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: lenet-dlg}\ngrid: {attack: [no-such]}\n")   # fails at once, no attack runs
    out = {"new": tmp_path / "sw", "new-below-new": tmp_path / "a" / "b" / "sw", "empty": tmp_path / "sw"}[kind]
    if kind == "empty":
        out.mkdir()
    code, lines = run_cli(["sweep", spec, "--out", out, "--executor", "inline", "--no-progress"], capsys)
    assert code == 0, lines
    assert (out / "results.sqlite").is_file() and (out / "results.csv").is_file()


_names = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b
                                                   and b not in (b".", b".."))


@settings(SETTINGS, max_examples=15)
@given(name=_names, below=st.booleans())
def test_random_out_names_for_sweep_and_dashboard(name, below, tmp_path, capsys):
    """Any byte string as --out: a UTF-8 name works, anything else is one clean error."""
    tmp_path = fresh(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: lenet-dlg}\ngrid: {attack: [no-such]}\n")
    sweep = make_sweep(tmp_path / "sw")
    base = os.fsencode(tmp_path) + (b"/new/" if below else b"/")
    out = os.fsdecode(base + name)
    page = os.fsdecode(base + name + b".html")
    try:
        name.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    for args in (["sweep", spec, "--out", out, "--executor", "inline", "--no-progress"],
                 ["dashboard", sweep, "--out", page]):
        if utf8:
            code, lines = run_cli(args, capsys)
            assert code == 0, lines
        else:
            expect_clean_error(args, capsys, tmp_path, contains="not valid UTF-8")
    if utf8:
        assert (Path(out) / "results.sqlite").is_file() and Path(page).is_file()


def test_dashboard_of_a_non_utf8_folder(tmp_path, capsys):
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/sw\xff")
    make_sweep(Path(folder))
    # the default page would get a non-UTF-8 name: refused; an explicit --out works
    expect_clean_error(["dashboard", folder], capsys, tmp_path, contains="not valid UTF-8")
    code, lines = run_cli(["dashboard", folder, "--out", tmp_path / "page.html"], capsys)
    assert code == 0, lines
    assert "Sweep: sw\ufffd" in (tmp_path / "page.html").read_text()


def test_sweep_out_folder_left_with_only_sweep_files_is_resumable(tmp_path):
    spec = parse_spec({"base": {k: v for k, v in BASE.items() if k != "attack"}, "grid": {"attack": ["no-such"]}})
    out = tmp_path / "sw"
    out.mkdir()
    (out / ".sweep.lock").touch()                     # killed before the store was created
    (out / ".results.csv.abc123.tmp").write_text("")  # and during an atomic write
    summary = engine.run_sweep(spec, out, executor="inline", progress=False)
    assert len(summary.computed) == 1 and (out / "results.sqlite").is_file()


def test_sweep_api_checks_options_before_work(tmp_path, no_work):
    spec = parse_spec({"base": BASE, "grid": {"seed": [0]}})
    for kwargs, message in (({"executor": "nope"}, "executor"), ({"workers": 0}, "workers"),
                            ({"address": "x:1", "executor": "local"}, "address")):
        with pytest.raises(ConfigError, match=message):
            engine.run_sweep(spec, tmp_path / "sw", progress=False, **kwargs)
    assert not (tmp_path / "sw").exists()


# ================================================================== damaged results store
STORE_MUTATIONS = {
    "grid-bad-json": "UPDATE cells SET grid = '{bad' WHERE rowid = 2",
    "config-bad-json": "UPDATE cells SET config = '[1, 2' WHERE rowid = 1",
    "metrics-bad-json": "UPDATE cells SET metrics = 'NaN garbage' WHERE rowid = 1",
    "grid-is-list": "UPDATE cells SET grid = '[1, 2]'",
    "config-is-number": "UPDATE cells SET config = '3'",
    "metrics-is-string": "UPDATE cells SET metrics = '\"x\"' WHERE rowid = 1",
    "grid-deep": "UPDATE cells SET grid = '" + "[" * 100 + "]" * 100 + "'",
    "metrics-very-deep": "UPDATE cells SET metrics = '" + '{"a":' * 50_000 + "1" + "}" * 50_000 + "' WHERE rowid = 1",
    "metrics-huge": "UPDATE cells SET metrics = '\"' || hex(zeroblob(5000000)) || '\"' WHERE rowid = 1",
    "metrics-int-too-long": "UPDATE cells SET metrics = '{\"a\": " + "9" * 5000 + "}' WHERE rowid = 1",
    "grid-is-blob": "UPDATE cells SET grid = X'7B7D'",
    "cell-id-null": "UPDATE cells SET cell_id = NULL WHERE rowid = 1",
    "cell-id-int": "UPDATE cells SET cell_id = 7 WHERE rowid = 1",
    "cell-id-newline": "UPDATE cells SET cell_id = 'a' || char(10) || 'b' WHERE rowid = 1",
    "status-unknown": "UPDATE cells SET status = 'weird'",
    "status-int": "UPDATE cells SET status = 1",
    "error-blob": "UPDATE cells SET error = X'00ff'",
    "wall-text": "UPDATE cells SET wall_seconds = 'abc'",
    "finished-blob": "UPDATE cells SET finished_at = X'00'",
    "cell-id-not-an-id": "UPDATE cells SET cell_id = 'x' WHERE rowid = 1",
    "no-sweeps-table": "DROP TABLE sweeps",
    "no-cells-table": "DROP TABLE cells",
    "no-meta-table": "DROP TABLE meta",
    "no-version": "DELETE FROM meta",
    "version-2": "UPDATE meta SET value = '2'",
    "column-renamed": "ALTER TABLE cells RENAME COLUMN metrics TO m",
    "column-added": "ALTER TABLE cells ADD COLUMN extra TEXT",
    "sweeps-column-dropped": "ALTER TABLE sweeps DROP COLUMN pending",
}


def _mutate(folder: Path, sql: str) -> None:
    con = sqlite3.connect(folder / "results.sqlite")
    try:
        con.execute(sql)
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("mutation", list(STORE_MUTATIONS))
def test_damaged_store_rows_and_schema(mutation, tmp_path, capsys, no_work):
    sweep = make_sweep(tmp_path / "sw")
    _mutate(sweep, STORE_MUTATIONS[mutation])
    spec = spec_file(tmp_path, cells=4)                      # one cell not yet in the store
    line = expect_clean_error(["dashboard", sweep], capsys, tmp_path, contains="results.sqlite")
    assert "sweep store" in line
    expect_clean_error(["sweep", spec, "--out", sweep, "--executor", "inline", "--no-progress"], capsys, tmp_path,
                       contains="results.sqlite")
    assert not no_work


@SETTINGS
@given(column=st.sampled_from(["cell_id", "status", "grid", "config", "metrics", "error", "wall_seconds", "worker",
                               "finished_at"]),
       value=st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=30),
                       st.binary(max_size=30), _json_values.map(json.dumps)))
def test_random_values_in_store_columns(column, value, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    sweep = make_sweep(tmp_path / "sw", cells=2)
    con = sqlite3.connect(sweep / "results.sqlite")
    try:
        con.execute(f"UPDATE cells SET {column} = ? WHERE rowid = 1", (value,))
        con.commit()
    except sqlite3.IntegrityError:      # NOT NULL / PRIMARY KEY: the store refuses it itself
        assume(False)
    finally:
        con.close()
    before = snapshot(tmp_path)
    code, lines = run_cli(["dashboard", sweep], capsys)
    if code == 0:   # a value gradleak could have written: the page is the only new file
        after = snapshot(tmp_path)
        assert set(after) - set(before) == {str(sweep / "dashboard.html")}
        assert all(after[k] == v for k, v in before.items())
    else:
        assert code == 2 and len(lines) == 1 and lines[0].startswith("gradleak: error:"), lines
        assert snapshot(tmp_path) == before


@SETTINGS
@given(frac=st.floats(0.0, 0.99))
def test_truncated_store(frac, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    sweep = make_sweep(tmp_path / "sw")
    raw = (sweep / "results.sqlite").read_bytes()
    cut = int(len(raw) * frac)
    assume(cut > 0)     # an empty file is a new store for a sweep (tested below)
    (sweep / "results.sqlite").write_bytes(raw[:cut])
    spec = spec_file(tmp_path, cells=4)
    expect_clean_error(["dashboard", sweep], capsys, tmp_path, contains="results.sqlite")
    expect_clean_error(["sweep", spec, "--out", sweep, "--executor", "inline", "--no-progress"], capsys, tmp_path,
                       contains="results.sqlite")


@SETTINGS
@given(data=st.binary(min_size=1, max_size=2000))
def test_random_bytes_as_store(data, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "results.sqlite").write_bytes(data)
    spec = spec_file(tmp_path)
    expect_clean_error(["dashboard", sweep], capsys, tmp_path)
    expect_clean_error(["sweep", spec, "--out", sweep, "--executor", "inline", "--no-progress"], capsys, tmp_path)


@SETTINGS
@given(pos=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_flipped_byte_in_store(pos, byte, tmp_path, capsys, no_work):
    tmp_path = fresh(tmp_path)
    sweep = make_sweep(tmp_path / "sw")
    raw = bytearray((sweep / "results.sqlite").read_bytes())
    i = pos % len(raw)
    assume(raw[i] != byte)
    raw[i] = byte
    (sweep / "results.sqlite").write_bytes(bytes(raw))
    for args in (["dashboard", sweep, "--out", tmp_path / "page.html"],
                 ["sweep", spec_file(tmp_path), "--out", sweep, "--executor", "inline", "--no-progress"]):
        before = snapshot(tmp_path)
        code, lines = run_cli(args, capsys)
        if code != 0:      # a harmless flip (free space, a digit) may leave a valid store
            assert code == 2 and len(lines) == 1 and lines[0].startswith("gradleak: error:"), lines
            assert snapshot(tmp_path) == before


def test_empty_store_file(tmp_path, capsys, no_work):
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "results.sqlite").write_bytes(b"")
    expect_clean_error(["dashboard", sweep], capsys, tmp_path, contains="not a gradleak sweep store")


def test_store_api_errors_are_typed(tmp_path):
    sweep = make_sweep(tmp_path / "sw")
    _mutate(sweep, STORE_MUTATIONS["grid-bad-json"])
    with ResultStore(sweep, create=False) as store:
        with pytest.raises(GradleakError, match="row 2"):
            list(store.records())
        with pytest.raises(GradleakError):
            store.validate()
    with pytest.raises(GradleakError, match="holds no sweep results"):
        ResultStore(tmp_path / "none", create=False)
    assert not (tmp_path / "none").exists()          # create=False creates nothing


# ================================================================== dashboard --out and DIR
def _dash_out(kind: str, tmp_path: Path, sweep: Path) -> tuple[object, str]:
    user = tmp_path / "user.txt"
    user.write_text("precious")
    if kind == "store":
        return sweep / "results.sqlite", "same file"
    if kind == "csv":
        return sweep / "results.csv", "same file"
    if kind == "lock":
        return sweep / ".sweep.lock", "same file"
    if kind == "journal-name":
        return sweep / "results.sqlite-journal", "same file"
    if kind == "store-via-dotdot":
        (sweep / "sub").mkdir()
        return sweep / "sub" / ".." / "results.sqlite", "same file"
    if kind == "user-file-in-folder":
        (sweep / "notes.txt").write_text("mine")
        return sweep / "notes.txt", "not a page gradleak dashboard wrote"
    if kind == "user-html":
        (sweep / "index.html").write_text("<!DOCTYPE html><html><body>my page</body></html>")
        return sweep / "index.html", "not a page gradleak dashboard wrote"
    if kind == "user-file-elsewhere":
        return user, "not a page gradleak dashboard wrote"
    if kind == "folder":
        return sweep, "is a folder"
    if kind == "dot":
        return ".", "'.'"
    if kind == "symlink-to-user-file":
        (tmp_path / "lnk.html").symlink_to(user)
        return tmp_path / "lnk.html", "symbolic link"
    if kind == "dangling-symlink":
        (tmp_path / "lnk.html").symlink_to(tmp_path / "made.html")
        return tmp_path / "lnk.html", "symbolic link"
    if kind == "below-file":
        return user / "page.html", "is a file, not a folder"
    if kind == "fifo":
        return fifo(tmp_path / "page.html"), "not a regular file"
    if kind == "dev-null":
        return "/dev/null", "not a regular file"
    if kind == "non-utf8":
        return os.fsdecode(os.fsencode(tmp_path) + b"/p\xff.html"), "not valid UTF-8"
    if kind == "unwritable":
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o555)
        return tmp_path / "ro" / "page.html", "not writable"
    raise AssertionError(kind)


DASH_OUT_KINDS = ["store", "csv", "lock", "journal-name", "store-via-dotdot", "user-file-in-folder", "user-html",
                  "user-file-elsewhere", "folder", "dot", "symlink-to-user-file", "dangling-symlink", "below-file",
                  "fifo", "dev-null", "non-utf8", "unwritable"]


@pytest.mark.parametrize("kind", DASH_OUT_KINDS)
def test_dashboard_out_never_replaces_a_data_or_user_file(kind, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = make_sweep(tmp_path / "sw")
    out, message = _dash_out(kind, tmp_path, sweep)
    if kind == "unwritable":
        deny_writes_as_root(monkeypatch, tmp_path / "ro")
    try:
        expect_clean_error(["dashboard", sweep, "--out", out], capsys, tmp_path, contains=message)
    finally:
        if (tmp_path / "ro").exists():
            os.chmod(tmp_path / "ro", 0o755)


def test_dashboard_replaces_only_its_own_pages(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sw")
    assert run_cli(["dashboard", sweep], capsys)[0] == 0
    first = (sweep / "dashboard.html").read_bytes()
    assert b'name="generator" content="gradleak dashboard"' in first[:4096]
    assert run_cli(["dashboard", sweep], capsys)[0] == 0               # an earlier page: replaced
    assert run_cli(["dashboard", sweep, "--out", tmp_path / "elsewhere.html"], capsys)[0] == 0
    assert run_cli(["dashboard", sweep, "--out", tmp_path / "elsewhere.html"], capsys)[0] == 0
    leftovers = [p.name for p in list(sweep.iterdir()) + list(tmp_path.iterdir()) if p.name.endswith(".tmp")]
    assert not leftovers


@pytest.mark.parametrize("kind, message", [
    ("absent", "does not exist"), ("file", "is a file"), ("empty-folder", "no sweep results"),
    ("store-folder", "is a folder"), ("store-fifo", "not a regular file"), ("store-dev-zero", "not a regular file"),
    ("audit-folder", "is a folder"), ("audit-fifo", "not a regular file"), ("audit-dev-zero", "not a regular file"),
    ("audit-latin-1", "not UTF-8"), ("audit-nul", "NUL"), ("audit-empty", "empty"),
    ("audit-too-large", "bytes; at most"), ("audit-huge-field", "not a readable CSV"),
])
def test_dashboard_dir_that_is_not_what_it_claims(kind, message, tmp_path, capsys):
    d = tmp_path / "d"
    if kind == "file":
        d.write_text("x")
    elif kind != "absent":
        d.mkdir()
    target = {"store": d / "results.sqlite", "audit": d / "audit.csv"}.get(kind.split("-")[0])
    if kind.endswith("-folder") and target is not None:
        target.mkdir()
    elif kind.endswith("-fifo"):
        fifo(target)
    elif kind.endswith("-dev-zero"):
        target.symlink_to("/dev/zero")
    elif kind == "audit-latin-1":
        target.write_bytes("round,client\n1,caf\xe9\n".encode("latin-1"))
    elif kind == "audit-nul":
        target.write_bytes(b"round,client\n1,\x002\n")
    elif kind == "audit-empty":
        target.write_bytes(b"")
    elif kind == "audit-too-large":
        with open(target, "wb") as fh:
            fh.truncate(200 * 1024 * 1024)
    elif kind == "audit-huge-field":
        target.write_text("round,client,error\n1,a," + "x" * 200_000 + "\n")
    expect_clean_error(["dashboard", d], capsys, tmp_path, contains=message)


AUDIT_HEADER = ["round", "client", "node_id", "attack", "status", "num_examples", "psnr_mean", "ssim_mean",
                "label_accuracy", "gradient_distance", "error"]


def _audit_row(rnd: int, client: str, psnr: str) -> list[str]:
    return [str(rnd), client, "", "dlg", "ok", "4", psnr, "0.5", "1.0", "0.1", ""]


@SETTINGS
@given(n_rows=st.integers(1, 6), bad_at=st.integers(0, 6), size=st.integers(1, 25))
def test_ragged_audit_csv(n_rows, bad_at, size, tmp_path, capsys):
    tmp_path = fresh(tmp_path)
    import csv
    import io

    assume(size != len(AUDIT_HEADER))
    rows = [_audit_row(r, f"c{r % 2}", f"{10 + r}.5") for r in range(n_rows)]
    rows.insert(min(bad_at, n_rows), ["1", "c9"][:size] + [f"v{i}" for i in range(size - 2)])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([AUDIT_HEADER, *rows])
    d = tmp_path / "audit"
    d.mkdir()
    (d / "audit.csv").write_text(buf.getvalue())
    expect_clean_error(["dashboard", d], capsys, tmp_path, contains="fields, the header has")


@SETTINGS
@given(column=st.sampled_from(["round", "num_examples", "psnr_mean", "ssim_mean", "label_accuracy",
                               "gradient_distance"]),
       value=st.text(min_size=1, max_size=12))
def test_non_numeric_audit_values(column, value, tmp_path, capsys):
    tmp_path = fresh(tmp_path)
    import csv
    import io

    try:
        float(value) if column != "round" else int(value)
        assume(column == "round" and not 0 <= int(value) < 2**31)
    except ValueError:
        pass
    row = dict(zip(AUDIT_HEADER, _audit_row(1, "c0", "12.5")))
    row[column] = value
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(AUDIT_HEADER)
    w.writerow([row[c] for c in AUDIT_HEADER])
    d = tmp_path / "audit"
    d.mkdir()
    (d / "audit.csv").write_text(buf.getvalue(), encoding="utf-8")
    expect_clean_error(["dashboard", d], capsys, tmp_path, contains=column)


@pytest.mark.parametrize("header", [["client", "psnr_mean"], ["round", "psnr_mean"], ["round", "client", "round"]])
def test_audit_csv_missing_or_repeated_columns(header, tmp_path, capsys):
    d = tmp_path / "audit"
    d.mkdir()
    (d / "audit.csv").write_text(",".join(header) + "\n" + ",".join("1" for _ in header) + "\n")
    expect_clean_error(["dashboard", d], capsys, tmp_path, contains="audit.csv")


@pytest.mark.parametrize("run, message", [
    ("../elsewhere", "is not a run folder"), ("/etc", "is not a run folder"), ("runs/../../x", "is not a run folder"),
    ("runs/absent", "missing or not a folder"), ("runs/link", "missing or not a folder"),
    ("runs/file", "missing or not a folder"), ("runs/empty", "metrics.json not found"),
    ("runs/bad-json", "metrics.json"), ("runs/not-object", "JSON object"),
])
def test_audit_index_pointing_at_no_run_folder(run, message, tmp_path, capsys):
    """An audit index (audit.csv with a run column) whose run folder is outside the audit, a link,
    absent or without a usable metrics.json: one clean error naming it, no page."""
    d = tmp_path / "audit"
    (d / "runs" / "empty").mkdir(parents=True)
    (d / "runs" / "bad-json").mkdir()
    (d / "runs" / "bad-json" / "metrics.json").write_text("{")
    (d / "runs" / "not-object").mkdir()
    (d / "runs" / "not-object" / "metrics.json").write_text("[1]")
    (d / "runs" / "file").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "metrics.json").write_text("{}")
    (d / "runs" / "link").symlink_to(tmp_path / "elsewhere")
    (d / "audit.csv").write_text("round,client,node_id,attack,status,verdict,psnr_mean,relative_gradient_distance,"
                                 f"run,error\n1,0,,idlg,ok,leaked,30.0,1e-9,{run},\n")
    expect_clean_error(["dashboard", d], capsys, tmp_path, contains=message)
    assert not (d / "dashboard.html").exists()


def test_extreme_numbers_render(tmp_path, capsys):
    """Finite numbers near the float limit (or ints beyond it) in a store or an audit.csv: the
    page renders (they are listed, not plotted)."""
    import csv
    import io

    from gradleak.report.dashboard import render_dashboard
    from gradleak.sweep.dashboard_cli import sweep_stores

    extremes = [1e308, -1e308, 1.7976931348623157e308, 5e-324, 10**400, -(10**30)]
    with ResultStore(tmp_path / "sw") as store:
        for i, v in enumerate(extremes):
            store.add(f"{i:016x}", {"batch_size": i + 1}, {"attack": "dlg", "batch_size": i + 1,
                                                            "defense": [] if i % 2 else ["x"]},
                      {"status": "ok", "metrics": {"psnr_mean": v, "label_accuracy": v, "iip": v,
                                                   "model_accuracy": v, "ssim_mean": v}})
    assert render_dashboard(tmp_path / "sw", stores=sweep_stores()).is_file()
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(
        [AUDIT_HEADER] + [_audit_row(r, f"c{r % 2}", v) for r, v in enumerate(["1e308", "-1e308", "inf", "nan", "3"])])
    d = tmp_path / "audit"
    d.mkdir()
    (d / "audit.csv").write_text(buf.getvalue())
    code, lines = run_cli(["dashboard", d], capsys)
    assert code == 0, lines


def test_well_formed_audit_still_renders(tmp_path, capsys):
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(
        [AUDIT_HEADER] + [_audit_row(r, f"c{c}", "" if c else f"{20 + r}") for r in range(3) for c in range(2)])
    d = tmp_path / "audit"
    d.mkdir()
    (d / "audit.csv").write_text(buf.getvalue())
    code, lines = run_cli(["dashboard", d], capsys)
    assert code == 0, lines
    assert "Flower audit" in (d / "dashboard.html").read_text()


_metric_values = st.one_of(st.none(), st.booleans(), st.integers(-2**62, 2**62),
                           st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                           st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.none()))


@settings(SETTINGS, max_examples=10)
@given(records=st.lists(st.fixed_dictionaries({
    "config": st.fixed_dictionaries({"attack": _metric_values, "batch_size": _metric_values, "defense": _metric_values,
                                     "model": _metric_values}),
    "metrics": st.fixed_dictionaries({"psnr_mean": st.one_of(st.floats(-1e308, 1e308), _metric_values),
                                      "label_accuracy": _metric_values, "iip": _metric_values,
                                      "model_accuracy": _metric_values})}), min_size=1, max_size=4))
def test_dashboard_renders_any_well_typed_store(records, tmp_path):
    tmp_path = fresh(tmp_path)
    from gradleak.report.dashboard import render_dashboard
    from gradleak.sweep.dashboard_cli import sweep_stores

    with ResultStore(tmp_path / "sw") as store:
        for i, r in enumerate(records):
            store.add(f"{i:016x}", {"batch_size": r["config"]["batch_size"], "defense": r["config"]["defense"]},
                      r["config"], {"status": "ok" if i % 3 else "failed", "metrics": r["metrics"], "error": "e"})
    page = render_dashboard(tmp_path / "sw", stores=sweep_stores()).read_text()
    assert page.startswith("<!DOCTYPE html>")


# ================================================================== run reports
def _run_folder(tmp_path: Path, name: str = "run", metrics=None, text: bool = False) -> Path:
    run = tmp_path / name
    run.mkdir()
    metrics = metrics if metrics is not None else {"attack": "dlg", "model": "lenet-dlg", "data": "x", "batch_size": 1,
                                                   "psnr_mean": 20.0, "per_image": []}
    if text:
        metrics = {**metrics, "modality": "text"}
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "config.json").write_text(json.dumps({"attack": "dlg"}))
    (run / "history.csv").write_text("iteration,loss,psnr\n0,1.0,\n1,0.5,3\n")
    return run


def _renderers():
    from gradleak.report.html import render_report
    from gradleak.text.report import render_text_report

    return [render_report, render_text_report]


@SETTINGS
@given(depth=st.one_of(st.integers(65, 900), st.integers(1000, 200_000)), kind=st.sampled_from(["list", "dict"]),
       where=st.sampled_from(["metrics", "inside-metrics", "config"]))
def test_deep_json_in_run_folder(depth, kind, where, tmp_path):
    tmp_path = fresh(tmp_path)
    run = _run_folder(tmp_path)
    deep = "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth
    if where == "metrics":
        (run / "metrics.json").write_text(deep)
    elif where == "inside-metrics":
        (run / "metrics.json").write_text('{"attack": "dlg", "extra": ' + deep + "}")
    else:
        (run / "config.json").write_text(deep)
    before = snapshot(tmp_path)
    for render in _renderers():
        with pytest.raises(GradleakError, match="nested more than"):
            render(run)
    assert snapshot(tmp_path) == before


@SETTINGS
@given(depth=st.integers(65, 800))
def test_deep_metrics_json_on_the_cli(depth, tmp_path, capsys):
    tmp_path = fresh(tmp_path)
    run = _run_folder(tmp_path)
    (run / "metrics.json").write_text('{"attack": "dlg", "x": ' + "[" * depth + "]" * depth + "}")
    expect_clean_error(["report", run], capsys, tmp_path, contains="nested more than")


def test_very_deep_metrics_json_on_the_cli(tmp_path, capsys):
    run = _run_folder(tmp_path)
    (run / "metrics.json").write_text("[" * 100_000 + "]" * 100_000)
    expect_clean_error(["report", run], capsys, tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_metrics_json_not_a_file_on_the_cli(kind, tmp_path, capsys):
    """`gradleak report` never blocks on a FIFO nor reads a folder named metrics.json."""
    run = _run_folder(tmp_path)
    (run / "metrics.json").unlink()
    if kind == "fifo":
        os.mkfifo(run / "metrics.json")
    else:
        (run / "metrics.json").mkdir()
    expect_clean_error(["report", run], capsys, tmp_path)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_random_bytes_as_metrics_json(data, tmp_path, capsys):
    tmp_path = fresh(tmp_path)
    run = _run_folder(tmp_path)
    (run / "metrics.json").write_bytes(data)
    try:
        ok = isinstance(json.loads(data), dict)
    except (ValueError, RecursionError):
        ok = False
    assume(not ok)
    expect_clean_error(["report", run], capsys, tmp_path)


@settings(SETTINGS, max_examples=25)
@given(metrics=st.dictionaries(
    st.sampled_from(["attack", "model", "data", "batch_size", "per_image", "per_sentence", "threat", "defenses",
                     "update", "versions", "class_names", "psnr_mean", "status", "divergence", "lpips_notice",
                     "iip_feature_space", "bag_of_words", "recovered_sentences", "token_accuracy_dlg", "modality",
                     "label_method", "other"]),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
                 lambda c: st.one_of(st.lists(c, max_size=3),
                                     st.dictionaries(st.sampled_from(["tokens_true", "tokens_recovered", "match",
                                                                      "recovered_in_set", "tokens", "label_true",
                                                                      "index", "psnr", "message", "x"]), c,
                                                     max_size=4)),
                 max_leaves=12)))
def test_ill_typed_metrics_render_or_fail_cleanly(metrics, tmp_path):
    tmp_path = fresh(tmp_path)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.json").write_text(json.dumps(metrics))
    for render in _renderers():
        try:
            page = render(run).read_text()
        except GradleakError as exc:
            assert "\n" not in str(exc)
        else:
            assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()


_cells_text = st.one_of(st.sampled_from(["", "0", "1", "-1", "1e308", "-1e308", "5e-324", "1e-300", "inf", "-inf",
                                         "nan", "1e400", "9" * 400, "dlg", "discrete", "search", "bow", "x"]),
                        st.text(max_size=5))


@settings(SETTINGS, max_examples=15)
@given(header=st.lists(st.sampled_from(["iteration", "loss", "psnr", "phase", "token_accuracy", "other"]),
                       min_size=1, max_size=6),
       rows=st.lists(st.lists(_cells_text, max_size=7), max_size=8))
def test_hostile_history_csv(header, rows, tmp_path):
    """Any history.csv (ragged rows, numbers at the float limit, text): the report renders
    (what cannot be plotted is left out) or fails with one clean error."""
    import csv
    import io

    tmp_path = fresh(tmp_path)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([header, *rows])
    for text in (False, True):
        run = _run_folder(tmp_path, f"run{int(text)}", text=text)
        (run / "history.csv").write_text(buf.getvalue())
        try:
            page = _renderers()[int(text)](run).read_text()
        except GradleakError as exc:
            assert "\n" not in str(exc)
        else:
            assert page.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("file, kind, message", [
    ("metrics.json", "folder", "is a folder"), ("metrics.json", "absent", "not found"),
    ("metrics.json", "dev-zero", "not a regular file"), ("metrics.json", "fifo", "not a regular file"),
    ("metrics.json", "latin-1", "not UTF-8"), ("metrics.json", "too-large", "bytes; at most"),
    ("metrics.json", "list", "JSON object"),
    ("config.json", "folder", "is a folder"), ("config.json", "dev-zero", "not a regular file"),
    ("config.json", "fifo", "not a regular file"), ("config.json", "bad-json", "not valid JSON"),
    ("history.csv", "folder", "is a folder"), ("history.csv", "dev-zero", "not a regular file"),
    ("history.csv", "huge-field", "not a readable CSV"), ("history.csv", "latin-1", "not UTF-8"),
    ("reconstruction.png", "folder", "is a folder"), ("reconstruction.png", "fifo", "not a regular file"),
])
def test_run_folder_files_that_are_not_what_they_claim(file, kind, message, tmp_path):
    run = _run_folder(tmp_path)
    path = run / file
    if path.exists():
        path.unlink()
    if make_not_a_file(path, kind, 100 * 1024 * 1024):
        pass
    elif kind == "latin-1":
        path.write_bytes('{"attack": "caf\xe9"}\n'.encode("latin-1"))
    elif kind == "list":
        path.write_text("[1, 2]")
    elif kind == "bad-json":
        path.write_text("{")
    elif kind == "huge-field":
        path.write_text("iteration,loss\n1," + "9" * 200_000 + "\n")
    before = snapshot(tmp_path)
    for render in _renderers()[:1] if file == "reconstruction.png" else _renderers():   # text runs have no PNG
        with pytest.raises(GradleakError, match=message) as err:
            render(run)
        assert "\n" not in str(err.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind, message", [("folder", "is a folder"), ("symlink-to-user-file", "symbolic link"),
                                           ("dangling-symlink", "symbolic link"), ("fifo", "not a regular file"),
                                           ("unwritable-run", "not writable")])
def test_report_html_that_cannot_be_replaced(kind, message, tmp_path, capsys, monkeypatch):
    run = _run_folder(tmp_path)
    user = tmp_path / "user.txt"
    user.write_text("precious")
    target = run / "report.html"
    if kind == "folder":
        target.mkdir()
    elif kind == "symlink-to-user-file":
        target.symlink_to(user)
    elif kind == "dangling-symlink":
        target.symlink_to(tmp_path / "made.html")
    elif kind == "fifo":
        fifo(target)
    elif kind == "unwritable-run":
        os.chmod(run, 0o555)
        deny_writes_as_root(monkeypatch, run)
    try:
        for render in _renderers():
            before = snapshot(tmp_path)
            with pytest.raises(GradleakError, match=message):
                render(run)
            assert snapshot(tmp_path) == before
        if kind != "fifo":   # cli.py reads metrics.json itself first; a FIFO report.html is fine there
            expect_clean_error(["report", run], capsys, tmp_path, contains=message)
    finally:
        os.chmod(run, 0o755)


def test_planted_links_at_old_temporary_names_are_not_followed(tmp_path):
    from gradleak.report import save_loss_plot

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for text in (False, True):
        run = _run_folder(tmp_path, f"run{int(text)}", text=text)
        (run / "report.html.tmp").symlink_to(victim)
        render = _renderers()[int(text)]
        assert render(run) == run / "report.html"
        assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")
    (tmp_path / "loss.tmp.png").symlink_to(victim)
    save_loss_plot(tmp_path / "loss.png", [{"iteration": 0, "loss": 1.0}])
    assert victim.read_text() == "precious"
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert not [p for p in tmp_path.rglob("*.tmp") if not p.is_symlink()]


@pytest.mark.parametrize("folder, shown", [
    (".r01-dlg.partial-myhost-8807-abc_12x", "r01-dlg"),
    (".r01-dlg.partial-my-host-8807-k3j2h1", "r01-dlg"),
    (".r01-dlg.partial-8807", "r01-dlg"),
    (".a.partial-b.partial-h-1-x", "a.partial-b"),
    ("plain-run", "plain-run"),
    (".hidden-run", ".hidden-run"),
])
def test_report_subtitle_names_the_final_run_folder(folder, shown, tmp_path):
    for text in (False, True):
        base = tmp_path / str(int(text))
        base.mkdir()
        run = _run_folder(base, folder, text=text)
        page = _renderers()[int(text)](run).read_text()
        assert f"report &middot; {shown}</p>" in page, page[page.find('class="sub"'):][:120]
        assert ".partial-" not in page.split('class="sub"')[1][:200] or ".partial-b" in shown
        page = _renderers()[int(text)](run, name="given").read_text()
        assert "report &middot; given</p>" in page


def test_report_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for render in _renderers():
        with pytest.raises(GradleakError, match="does not exist"):
            render(tmp_path / "absent")
        with pytest.raises(GradleakError, match="is a file"):
            render(tmp_path / "file")
    expect_clean_error(["report", tmp_path / "absent"], capsys, tmp_path, contains="does not exist")
