"""Text from run files, made safe for a terminal: a metric key or a run dir name is written by whoever
made the files, and an escape sequence in it (`\\x1b[2J`, an OSC title) would clear, colour or retitle the
reader's terminal (probe N33). Control characters are shown as Python escapes instead."""
from __future__ import annotations

import unicodedata


def terminal_safe(text: str) -> str:
    """`text` with every control or format character (C0, DEL, C1, bidi overrides, lone surrogates)
    written as its escape, the rest unchanged."""
    return "".join(c if unicodedata.category(c) not in ("Cc", "Cf", "Cs") else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe_lines(text: str) -> str:
    """`terminal_safe` line by line: the newlines between lines kept."""
    return "\n".join(terminal_safe(line) for line in text.split("\n"))
