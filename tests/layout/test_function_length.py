"""No function of the library, the flows or the tasks is over 60 lines (issue 51: a reader follows
each one on a screen; the structure reviews count them with `ast` the same way)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60


def long_functions(root: Path, tops=("miles", "flows", "tasks")) -> list[str]:
    found = []
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LIMIT:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                                     f"({lines} lines)")
    return found


def test_no_function_is_over_60_lines():
    assert long_functions(ROOT) == []


def test_the_rule_sees_a_long_function(tmp_path):
    (tmp_path / "miles").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "miles" / "long.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path) == ["miles/long.py:1 long (61 lines)"]
