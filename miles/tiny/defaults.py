"""The tiny defaults a run falls back on: the addition task, or the multi-turn calculator task."""
from __future__ import annotations

from pathlib import Path


def tiny_model(multi_turn: bool) -> Path:
    """The cached warm-started checkpoint of the task (made first if missing)."""
    if multi_turn:
        from miles.tiny.tool_warmstart import ensure_tool_model

        return ensure_tool_model(progress=False)
    from miles.tiny.warmstart import ensure_base_model

    return ensure_base_model(progress=False)


def tiny_task_data(multi_turn: bool) -> tuple[Path, Path]:
    """(train JSONL, eval JSONL) of the task."""
    if multi_turn:
        from miles.tiny.tool_warmstart import tool_task_data

        return tool_task_data()
    from miles.tiny.warmstart import default_task_data

    return default_task_data()
