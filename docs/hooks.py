"""MkDocs hook: fills the generated parts of the docs on every build, so they cannot drift.

- ``<!-- generated: cli -->`` becomes the CLI reference (scripts/docs_reference.py, from the parsers);
- ``<!-- spec: MODALITY NAME -->`` becomes what that attack declares in its SPEC;
- each ``reproduction/<folder>/reading.md`` becomes the page ``reproduction/<folder>.md`` (and
  ``reproduction/README.md`` ``reproduction/folders.md``), listed where ``<!-- generated: readings -->`` stands;
- ``<!-- generated: attack-table -->`` becomes the attacks' one-line table;
- an attack of ``gradleak list`` without its page stops the build."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_reference  # noqa: E402

SPEC_MARK = re.compile(r"<!-- spec: (image|text) ([a-z0-9-]+) -->")
LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(#[^)]*)?\)")


def reading_pages() -> dict[str, Path]:
    """reproduction/<folder>/reading.md (one level or two) by the page each becomes."""
    found = sorted((ROOT / "reproduction").glob("*/reading.md")) + sorted((ROOT / "reproduction").glob("*/*/reading.md"))
    return {"reproduction/" + "-".join(p.parent.relative_to(ROOT / "reproduction").parts) + ".md": p for p in found}


def _relink(text: str, source: Path) -> str:
    """A reading's links: to another folder's reading its page; to files of the repository, the
    path as code (they are not part of the site)."""
    folder = source.parent

    def one(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://")):
            return match.group(0)
        path = (folder / target).resolve()
        if path.is_dir() and (path / "reading.md").is_file():
            rel = path.relative_to(ROOT / "reproduction")
            return f"[{label}]({'-'.join(rel.parts)}.md)"
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else target
        return label if label.strip("`") == str(shown) else f"{label} (`{shown}`)"

    return LINK.sub(one, text)


def on_files(files, config):
    sources = {"reproduction/folders.md": ROOT / "reproduction" / "README.md", **reading_pages()}
    for uri, source in sources.items():
        text = source.read_text()
        files.append(File.generated(config, uri, content=_relink(text, source)))
    have = {f.src_uri for f in files}
    missing = [name for modality, name in docs_reference.attack_names()
               if "reference/attacks/" + docs_reference.page_name(modality, name) not in have]
    if missing:
        raise PluginError(f"attacks without a page in docs/reference/attacks/: {', '.join(missing)}")
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", docs_reference.cli_markdown())
    if "<!-- generated: readings -->" in markdown:
        links = [f"- [{uri[len('reproduction/'):-3]}]({uri[len('reproduction/'):]})" for uri in reading_pages()]
        markdown = markdown.replace("<!-- generated: readings -->", "\n".join(links))
    if "<!-- generated: attack-table -->" in markdown:
        markdown = markdown.replace("<!-- generated: attack-table -->", docs_reference.attack_table())
    return SPEC_MARK.sub(lambda m: docs_reference.spec_markdown(m.group(1), m.group(2)), markdown)
