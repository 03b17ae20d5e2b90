"""The package's functions stay small enough to read: none over MAX_FUNCTION_LINES lines (ruff
holds their branching to McCabe 15 and bugbear's rules, pyproject.toml), and its module docstrings
say what and why in a few lines (paper notes and measurements live in docs/)."""

import ast
import statistics
from pathlib import Path

import gradleak

MAX_FUNCTION_LINES = 100
MEDIAN_DOCSTRING_LINES = 4
MAX_DOCSTRING_LINES = 25
# being shortened separately; they count like every other module, and are named when they fail
LATER = {"outcome.py", "attacks/verdict.py", "defenses/floor.py", "pipeline/run.py", "pipeline/image.py",
         "pipeline/decoys.py"}


def test_no_function_in_the_package_is_over_100_lines():
    root = Path(gradleak.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def module_docstring_lines(source: str) -> int:
    """How many source lines the module's leading docstring spans (0 without one)."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def test_module_docstring_lines_are_counted_from_the_source():
    assert module_docstring_lines('"""One line."""\nx = 1\n') == 1
    assert module_docstring_lines('"""Two\nlines."""\n') == 2
    assert module_docstring_lines("x = 1\n") == 0
    assert module_docstring_lines("") == 0


def test_module_docstrings_are_a_few_lines():
    """Median at most MEDIAN_DOCSTRING_LINES, none over MAX_DOCSTRING_LINES, over every module."""
    root = Path(gradleak.__file__).parent
    lines = {str(p.relative_to(root)): module_docstring_lines(p.read_text(encoding="utf-8"))
             for p in sorted(root.rglob("*.py"))}
    assert len(lines) > 100
    median = statistics.median(lines.values())
    assert median <= MEDIAN_DOCSTRING_LINES, f"median module docstring {median} lines"
    long = sorted(f"{name} ({n} lines)" for name, n in lines.items() if n > MAX_DOCSTRING_LINES)
    later = [name for name in long if name.split(" ")[0] in LATER]
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {long}" + (
        f" (of which still to be shortened separately: {later})" if later else "")
