"""Text from files made safe to handle: one-line messages, echo to a terminal, and JSON (or YAML)
values bounded in depth and size before anything walks them."""

from __future__ import annotations

import json
from typing import Any

from ..errors import DataError, GradleakError

MAX_JSON_DEPTH = 64


def one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for a one-line error message: control characters escaped, at most ``limit``
    characters (hostile files put newlines and megabytes where a name is expected)."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."


def check_tree(value: Any, what: str, *, max_depth: int = MAX_JSON_DEPTH, max_items: int | None = None,
               error: type[GradleakError] = DataError) -> None:
    """Refuse a parsed JSON/YAML value nested deeper than ``max_depth`` or (with ``max_items``)
    holding more than ``max_items`` values once YAML aliases are expanded. Iterative: no
    recursion, stops as soon as a bound is passed (self-referencing values included)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    items = 0
    while stack:
        v, depth = stack.pop()
        items += 1
        if max_items is not None and items > max_items:
            raise error(f"{what} holds more than {max_items} values (YAML aliases included); refusing to expand it")
        if isinstance(v, (dict, list, tuple, set, frozenset)):
            if depth >= max_depth:
                raise error(f"{what} is nested more than {max_depth} levels deep")
            children = v.values() if isinstance(v, dict) else v
            stack.extend((c, depth + 1) for c in children)


def loads_json(text: str, what: str, *, error: type[GradleakError] = DataError) -> Any:
    """``json.loads`` of text read from a file or a store column, with every failure (syntax,
    nesting deep enough to exhaust the recursion limit, an integer of too many digits) one
    ``error`` naming ``what``; the value is also bounded by :func:`check_tree`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, int digit limit
        raise error(f"{what} is not valid JSON: {one_line(str(exc))}") from None
    check_tree(value, what, error=error)
    return value


def printable(text: object) -> str:
    """``text`` safe to echo to a terminal whatever a file put in it (a tensor's or a metadata
    name): every non-printable character (escape, carriage return, newline, bidi control) and the
    backslash written as Python escapes, so that a name can neither move the cursor nor pass for
    another; nothing is cut, so two names stay distinct."""
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in str(text))


__all__ = ["MAX_JSON_DEPTH", "check_tree", "loads_json", "one_line", "printable"]
