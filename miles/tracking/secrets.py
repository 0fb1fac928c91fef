"""Secret values of a run (from its config and environment) and a scrubber that blanks them.

The redacted config already drops secret fields; the scrubber is the second net for a
secret that leaks into a value that is not itself secret (a URI with a password, an
exception message) before it reaches stdout, a tracker or an artifact.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from miles.config import redacted_flat_dict
from miles.config.fields import is_secret_name

MASK = "***"
SECRETS_ENV = "MILES_TRACKING_SCRUB_SECRETS"  # flag secrets the trainer hands its delivery process (a JSON list)
MIN_SECRET_LEN = 4  # shorter values ("1", "on") would blank ordinary text and hide nothing


@dataclasses.dataclass(frozen=True)
class Scrubber:
    secrets: tuple[str, ...]

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def scrub_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.scrub_value(v) for v in value)
        if isinstance(value, dict):
            return {k: self.scrub_value(v) for k, v in value.items()}
        return value


def _longest_first(found: set[str]) -> tuple[str, ...]:
    """Long enough to be secrets, longest first, so a secret containing another is blanked whole."""
    return tuple(sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len, reverse=True))


def env_scrubber() -> Scrubber:
    """The delivery process's scrubber: secret-named env vars and the secrets its trainer handed over."""
    found = {v for k, v in os.environ.items() if is_secret_name(k)} | set(json.loads(os.environ.get(SECRETS_ENV, "[]")))
    return Scrubber(_longest_first(found))


def secret_values(config: Any, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every value of a secret config field and of an env var whose name says key/token/secret/password."""
    environ = os.environ if environ is None else environ
    found = {v for k, v in environ.items() if is_secret_name(k)}
    for section in config.sections():
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, str) and (f.metadata.get("secret") or is_secret_name(f.name)):
                found.add(value)
    return _longest_first(found)


def scrubber_for(config: Any) -> Scrubber:
    return Scrubber(secret_values(config))


def public_params(config: Any, scrubber: Scrubber) -> dict[str, Any]:
    """The flattened config safe to store as tracker params: secret fields redacted, then scrubbed."""
    return {k: scrubber.scrub_value(v) for k, v in redacted_flat_dict(config).items()}
