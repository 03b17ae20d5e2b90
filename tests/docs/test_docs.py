"""The documentation cannot drift from the CLI: every command a tutorial marks runnable runs here
(in-process, in a fresh folder, with the small settings the tutorial shows), the site builds with
``mkdocs build --strict`` (a broken link or a missing page fails), the generated CLI reference names
every sub-command and every flag of ``gradleak attack``, every attack of ``gradleak list`` has its
page, and the README stays short."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gradleak import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# <!-- runnable --> (exit 0), <!-- runnable: exit N -->, <!-- runnable: parse --> (flags checked by
# the parser only: a test elsewhere runs the command), <!-- runnable: file NAME --> (written as NAME)
BLOCK = re.compile(r"<!-- runnable(?::\s*(?P<mode>[^>]*?))?\s*-->\s*\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)
TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))


def runnable_blocks(page: Path) -> list[tuple[str, str, str]]:
    """(mode, language, text) of each block the page marks runnable, in page order."""
    return [((m.group("mode") or "").strip(), m.group("lang"), m.group("body")) for m in BLOCK.finditer(page.read_text())]


def commands(body: str) -> list[tuple[dict[str, str], list[str]]]:
    """The shell block's commands as (environment assignments, argv); continuation lines joined."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words:
            out.append((env, words))
    return out


def run_block(mode: str, lang: str, body: str, folder: Path, monkeypatch) -> None:
    """Run one runnable block in ``folder`` as its mode says."""
    if mode.startswith("file "):
        (folder / mode.split(None, 1)[1]).write_text(body + "\n")
        return
    if lang == "python":
        exec(compile(body, "<docs block>", "exec"), {"__name__": "__docs__"})
        return
    assert lang == "bash", lang
    want = int(mode.split()[1]) if mode.startswith("exit ") else 0
    for env, argv in commands(body):
        assert argv[0] == "gradleak", f"a runnable block runs gradleak commands only: {argv}"
        if env.get("PYTHONPATH") == ".":
            monkeypatch.syspath_prepend(str(folder))
        if mode == "parse":
            cli.command_parser(argv[1]).parse_args(argv[2:])
            continue
        code = cli.main(argv[1:])
        # inspect's "found something" is the tutorial's point; every other command must succeed
        assert code == (want if argv[1] == "inspect" else 0), (argv, code)


def test_every_tutorial_has_runnable_blocks():
    """The tutorials exist and each shows at least one command the tests run."""
    names = {p.stem for p in TUTORIALS}
    assert {"first-audit", "victim-attacker", "flower-app", "own-model-data", "reproduce-table"} <= names
    assert all(runnable_blocks(p) for p in TUTORIALS), [p.name for p in TUTORIALS if not runnable_blocks(p)]


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_commands_run(page, tmp_path, monkeypatch):
    """Each tutorial's runnable blocks, in order, in one fresh folder, as a reader runs them."""
    monkeypatch.chdir(tmp_path)
    for mode, lang, body in runnable_blocks(page):
        run_block(mode, lang, body, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as ``make test`` builds it: ``mkdocs build --strict``, offline."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_cli_reference_names_every_subcommand_and_attack_flag(site):
    """The generated CLI page: every sub-command of `gradleak --help`, and every flag of
    `gradleak attack --help`."""
    page = (site / "reference" / "cli" / "index.html").read_text()
    subs = cli.build_parser()._subparsers._group_actions[0].choices
    assert len(subs) >= 10
    for name in subs:
        assert f"gradleak {name}</code>" in page, name
    flags = [s for a in cli.command_parser("attack")._actions for s in a.option_strings if s.startswith("--")]
    assert len(flags) > 60
    missing = [f for f in flags if f"<code>{f}" not in page and f", {f}" not in page]
    assert not missing, missing


def test_every_listed_attack_has_its_page(site, capsys):
    """Each attack `gradleak list` prints (image and text) has a page with its SPEC's facts."""
    assert cli.main(["list"]) == 0
    listing = capsys.readouterr().out
    image = re.search(r"^attacks:\n(.*?)^\S", listing, re.S | re.M).group(1)
    text = re.search(r"^text attacks[^\n]*\n(.*?)^\S", listing, re.S | re.M).group(1)
    pages = [f"{name}" for name in re.findall(r"^  (\S+)", image, re.M)]
    pages += [f"text-{name}" for name in re.findall(r"^  (\S+)", text, re.M)]
    assert len(pages) >= 17
    for name in pages:
        html = site / "reference" / "attacks" / name / "index.html"
        assert html.is_file(), name
        assert "Declared in its SPEC" in html.read_text(), name


def test_readme_is_short_and_links_into_the_docs():
    """At most 200 lines and 20 KB; its two set-up commands; every relative link resolves."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.encode()) <= 20_000
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert sum(link.startswith("docs/") for link in links) >= 20
    broken = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not broken, broken
