"""The package stays readable: modules with one job, functions that fit on a screen.

Limits from the house rules (docs/architecture.md, "Shape of the code"): a module over
``MAX_MODULE_LINES`` or a function over ``MAX_FUNCTION_LINES`` has more than one job; split
it by job. Also: no object swaps its identity by copying another's attributes, and the
diagnosis reads facts from fields, never from cclctl's own error wording (the one parser of
old messages is ``diagnose/errtext_fallback.py``, for dumps that predate the fields and for PyTorch
Flight Recorder dumps; ``diagnose/stacks.py`` parses Python stack text).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cclctl"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
#: the diagnosis modules that may use regular expressions, and why (module docstring above)
DIAGNOSE_REGEX = {"diagnose/errtext_fallback.py", "diagnose/stacks.py"}


def _sources() -> list[tuple[str, str]]:
    return [
        (p.relative_to(PACKAGE).as_posix(), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
    ]


def long_modules(sources: list[tuple[str, str]]) -> list[str]:
    return [
        f"{rel}: {n} lines"
        for rel, text in sources
        if (n := len(text.splitlines())) > MAX_MODULE_LINES
    ]


def long_functions(sources: list[tuple[str, str]]) -> list[str]:
    found = []
    for rel, text in sources:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return found


def test_no_module_is_over_the_limit() -> None:
    assert long_modules(_sources()) == []


def test_no_function_is_over_the_limit() -> None:
    assert long_functions(_sources()) == []


def test_the_limits_catch_what_they_name() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    text = f"def long():\n{body}\n" + "\n" * MAX_MODULE_LINES
    assert long_functions([("m.py", text)]) == [f"m.py:1 long: {MAX_FUNCTION_LINES + 1} lines"]
    assert long_modules([("m.py", text)]) == [f"m.py: {len(text.splitlines())} lines"]


def test_no_object_takes_another_ones_identity() -> None:
    swap = re.compile(r"vars\([^)]*\)\.update\(")
    assert [rel for rel, text in _sources() if swap.search(text)] == []


def test_the_diagnosis_parses_no_error_wording_outside_errtext() -> None:
    uses_re = [
        rel
        for rel, text in _sources()
        if rel.startswith("diagnose/")
        and any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and any(a.name == "re" for a in node.names) | (getattr(node, "module", None) == "re")
            for node in ast.walk(ast.parse(text))
        )
    ]
    assert sorted(set(uses_re) - DIAGNOSE_REGEX) == []
