"""Text that encodes as UTF-8. JSON may spell a lone surrogate (`"\\ud800"`) and Python holds it in a str,
but no UTF-8 writer takes it: one such character in a sample made MLflow's table artifact fail, and
the dashboard's answer for that rollout a 500 (probes ST1, ST4). Readers and writers of free text
(samples, tables, what the dashboard serves) pass it through `valid_text` first."""
from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"  # U+FFFD, what a decoder puts for bytes that are not text


def lone_surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, None when it encodes as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _valid_str(text: str) -> str:
    if lone_surrogate_at(text) is None:
        return text
    return "".join(REPLACEMENT if "\ud800" <= c <= "\udfff" else c for c in text)


def valid_text(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (also dict keys, at any depth of lists and dicts)
    replaced by U+FFFD; anything else as it is. A value with none is returned unchanged."""
    if isinstance(value, str):
        return _valid_str(value)
    if isinstance(value, list):
        return [valid_text(v) for v in value]
    if isinstance(value, dict):
        return {valid_text(k): valid_text(v) for k, v in value.items()}
    return value


def may_hold_surrogate(raw: bytes) -> bool:
    """Whether a JSON text may spell a surrogate (`\\ud800`-`\\udfff`, any case): only such lines need
    `valid_text` (JSON parsed from UTF-8 bytes holds none otherwise)."""
    lowered = raw.lower()
    return any(f"\\u{c}".encode() in lowered for c in ("d8", "d9", "da", "db", "dc", "dd", "de", "df"))
