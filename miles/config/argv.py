"""A config section back into its command-line flags, so a child process gets the whole section.

Secrets are left out (they travel in the environment, never in argv where `ps` shows them);
`effective_settings` is the same section as one JSON-able dict with secrets redacted, the line
each service writes at the top of its log.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from miles.config.fields import flag_name, is_secret_name

REDACTED = "***"


def _secret(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get("secret")) or is_secret_name(field.name)


def section_argv(section: Any) -> list[str]:
    """`--flag value` for every field that is set; booleans as `--flag` / `--no-flag`, lists as
    `--flag=item` (one item) or `--flag item ...` (items that do not look like flags)."""
    argv: list[str] = []
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if _secret(field) or value is None:
            continue
        name = flag_name(field.name)
        if isinstance(value, bool):
            argv.append(name if value else f"--no-{field.name.replace('_', '-')}")
        elif isinstance(value, list):
            if len(value) == 1:
                argv.append(f"{name}={value[0]}")
            elif value:
                if any(str(item).startswith("-") for item in value):
                    raise ValueError(f"{name}: list items that look like flags cannot travel as separate "
                                     f"arguments: {value!r}")
                argv += [name, *map(str, value)]
        else:
            argv += [name, str(value)]
    return argv


def effective_settings(*sections: Any) -> dict[str, Any]:
    """Every field of `sections` by flag name (without dashes), secrets redacted."""
    out: dict[str, Any] = {}
    for section in sections:
        for field in dataclasses.fields(section):
            value = getattr(section, field.name)
            out[field.name] = REDACTED if value is not None and _secret(field) else value
    return out


def print_settings(service: str, *sections: Any) -> None:
    """The line a service writes first: `{"service": ..., "settings": {...}}`, secrets redacted."""
    print(json.dumps({"service": service, "settings": effective_settings(*sections)}), flush=True)
