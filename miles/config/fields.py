"""Declaring config fields: one `flag()` per field carries its CLI help, choices and checks.

Every subsystem keeps its own frozen dataclass of settings (engine, router, rollout, ...);
this module only knows how a field is described, not which fields exist.
"""
from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A bad flag value or combination; the message names the flag and what is allowed."""

    def __init__(self, flag: str, message: str):
        self.flag = flag
        super().__init__(f"{flag}: {message}")


def flag(
    default: Any,
    help: str,
    *,
    choices: tuple | None = None,
    existing_path: bool = False,
    or_names: tuple[str, ...] = (),
    secret: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A config field. `existing_path` fields must name something on disk (when set), or one of `or_names`;
    `secret` fields are never printed, logged or stored by trackers."""
    meta = dict(
        help=help,
        choices=choices,
        existing_path=existing_path,
        or_names=or_names,
        secret=secret,
        minimum=minimum,
        maximum=maximum,
        aliases=aliases,
    )
    if isinstance(default, (list, dict, set)):
        frozen = tuple(default) if not isinstance(default, dict) else default
        return dataclasses.field(default_factory=lambda: list(frozen), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


SECRET_WORDS = ("key", "token", "secret", "password")


def is_secret_name(name: str) -> bool:
    """Names that say key/token/secret/password hold secrets, whatever the field says."""
    low = name.lower().replace("-", "_")
    return any(word in low.split("_") or low.endswith(word) for word in SECRET_WORDS)
