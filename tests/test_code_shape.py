"""The package's functions stay small enough to read: none over MAX_FUNCTION_LINES lines (ruff
holds their branching to McCabe 15 and bugbear's rules, pyproject.toml)."""

import ast
from pathlib import Path

import gradleak

MAX_FUNCTION_LINES = 100


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
