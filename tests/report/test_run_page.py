"""The one run report skeleton (gradleak.report.run_page, issue 58): the image and the text report
both render through it, each supplying only its own sections; the skeleton reads the folder
before any section is built and frames every page the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradleak.errors import DataError
from gradleak.report import run_page
from gradleak.report.html import IMAGE_PAGE, render_report
from gradleak.report.run_page import RunFolder, RunPage, render_run_report
from gradleak.text.report import TEXT_PAGE, render_text_report

METRICS = {"attack": "dlg", "model": "lenet-dlg", "data": "cifar10-samples", "batch_size": 1, "converged": False,
           "verdict": "inconclusive", "versions": {"gradleak": "0.1.0", "torch": "2.14.1"}}


def _run(tmp_path: Path, metrics=None) -> Path:
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps(METRICS if metrics is None else metrics))
    (run / "config.json").write_text(json.dumps({"attack": {"name": "dlg"}}))
    (run / "history.csv").write_text("iteration,loss\n0,1.0\n1,0.5\n")
    return run


def test_both_modalities_render_through_the_one_skeleton(tmp_path, monkeypatch):
    """The verdict notice and the config section come from run_page for either modality: a marker
    put there shows on both pages, right under the summary's heading and at the page's end."""
    assert isinstance(IMAGE_PAGE, RunPage) and isinstance(TEXT_PAGE, RunPage)
    monkeypatch.setattr(run_page, "verdict_notice", lambda metrics: "<p>VERDICT-MARK</p>")
    monkeypatch.setattr(run_page, "config_section", lambda config: f"<p>CONFIG-MARK {config['attack']['name']}</p>")
    pages = []
    for render in (render_report, render_text_report):
        pages.append(render(_run(tmp_path / render.__name__)).read_text(encoding="utf-8"))
    for page in pages:
        assert page.count("VERDICT-MARK") == 1 and "<h2>Summary</h2><p>VERDICT-MARK</p>" in page
        assert page.endswith("<p>CONFIG-MARK dlg</p>\n</body>\n</html>\n")
    image, text = pages
    assert "gradleak run report &middot; run" in image and "gradleak text run report &middot; run" in text
    # one frame: the same title and the same versions table on both pages
    for part in ("<h1>dlg on lenet-dlg, cifar10-samples</h1>",
                 "<h2>Versions</h2><table><tr><th>gradleak</th><td>0.1.0</td></tr>"):
        assert part in image and part in text


def test_a_modality_supplies_only_its_sections(tmp_path):
    """A made-up modality's page: its sections in the skeleton's order, framed by the title, the
    subtitle, the versions and the config."""
    seen = []

    def summary(run: RunFolder) -> str:
        seen.append((run.path.name, run.config, run.history))
        return "<p>S</p>"

    page = RunPage(kind="toy report", css="", fmt=lambda key, value: str(value), summary=summary,
                   evidence=lambda run: ["<p>E1</p>", "<p>E2</p>"], history=lambda run: f"<p>H{len(run.history)}</p>")
    html = render_run_report(_run(tmp_path), page, name="r<1>").read_text(encoding="utf-8")
    assert seen == [("run", {"attack": {"name": "dlg"}}, [{"iteration": "0", "loss": "1.0"},
                                                          {"iteration": "1", "loss": "0.5"}])]
    body = html.split('<p class="sub">gradleak toy report &middot; r&lt;1&gt;</p>\n', 1)[1]
    parts = body.split("\n")
    assert parts[1:4] == ["<p>E1</p>", "<p>E2</p>", "<p>H2</p>"]
    assert parts[0].startswith("<h2>Summary</h2>") and parts[0].endswith("<p>S</p>")
    assert parts[4].startswith("<h2>Versions</h2>") and parts[5].startswith("<h2>Config</h2><details>")


def test_the_folder_is_read_before_any_section(tmp_path):
    """An unusable history.csv (a link) is one DataError before any section is built; nothing is
    written."""
    run = _run(tmp_path)
    (run / "history.csv").unlink()
    (run / "history.csv").symlink_to(tmp_path / "elsewhere.csv")

    def never(run: RunFolder):
        raise AssertionError("a section was built before the folder was read")

    page = RunPage(kind="toy report", css="", fmt=lambda key, value: str(value), summary=never, evidence=never,
                   history=never)
    with pytest.raises(DataError, match="symbolic link"):
        render_run_report(run, page)
    assert not (run / "report.html").exists()
