"""The calculator tool of the multi-turn task: its OpenAI-style spec and an async executor (Miles' shape)."""
from __future__ import annotations

import ast
import operator

TOOL_SPECS = [{
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an integer arithmetic expression with + - * and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_DIGITS = 30  # a result longer than this is refused rather than computed (x*x*x... grows fast)


def evaluate(expression: str) -> int:
    """The value of an integer expression of + - * and parentheses; ValueError for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](walk(node.left), walk(node.right))
            if len(str(abs(value))) > MAX_DIGITS:
                raise ValueError("result too large")
            return value
        raise ValueError(f"unsupported expression {expression!r}")

    return walk(tree.body)


async def execute_tool(name: str, arguments: dict) -> str:
    """`--generate-execute-tool-function-path` contract: (tool name, arguments) -> observation text."""
    if name != "calc":
        raise ValueError(f"no tool named {name!r}")
    return str(evaluate(str(arguments.get("expression", ""))))
