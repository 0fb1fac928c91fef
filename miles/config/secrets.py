"""Secrets travel in the environment, never as Prefect parameters: move them there and out of argv/config.

`miles train` calls `secrets_to_env` on its argv before the flow starts, and the flow calls
`export_secrets` on its config before handing it to a subflow, so the parameters Prefect
stores (and serves through its API) hold no secret; the processes read the environment.

Second, a scrubber that blanks a run's secret values (from its config and environment) wherever
they would leak into a value that is not itself secret (a URI with a password, an exception
message) before it reaches stdout, a tracker or an artifact; the redacted config already drops
the secret fields themselves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
from typing import Any
from urllib.parse import unquote

from miles.config.fields import flag_name, is_secret_name

# Each secret flag and the environment variable its readers fall back on.
SECRET_ENV = {"wandb_key": "WANDB_API_KEY", "router_admin_token": "MILES_ROUTER_ADMIN_TOKEN"}


def export_secrets(config):
    """Put the config's secret values into os.environ; return the config with them cleared."""
    cleared = {}
    for section in config.sections():
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if f.name in SECRET_ENV and value:
                os.environ[SECRET_ENV[f.name]] = value
                cleared[f.name] = None
    return config.replace(**cleared) if cleared else config


def strip_secret_flags(argv: list[str]) -> list[str]:
    """`argv` without the secret flags and their values (both `--flag value` and `--flag=value`)."""
    names = {flag_name(name) for name in SECRET_ENV}
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif arg.split("=", 1)[0] not in names:
            out.append(arg)
    return out


RUN_TOKEN_ENV = SECRET_ENV["router_admin_token"]  # the run's admin token: its router's and its engines'


def resolve_admin_token(router) -> str | None:
    """The router's admin token (`router`: a RouterConfig): `--router-admin-token`, else the environment's,
    where `ensure_run_token` puts a run's own. The router, its launchers and its clients all read it here."""
    return router.router_admin_token or os.environ.get(RUN_TOKEN_ENV) or None


def ensure_run_token(config) -> str:
    """The admin token of the router and the engines a run starts: `--router-admin-token` (or its env
    var), else a random one made now. It is put in this process's environment (never argv, never the
    config), where every launcher and the trainer of the run resolve the same one."""
    token = resolve_admin_token(config.router)
    if not token:
        token = secrets.token_urlsafe(32)
    os.environ[RUN_TOKEN_ENV] = token
    return token


@contextlib.contextmanager
def run_token(config):
    """`ensure_run_token` for the run inside the block; this process's environment is as before after it
    (a later run in the same process, a test, gets a token of its own)."""
    before = os.environ.get(RUN_TOKEN_ENV)
    try:
        yield ensure_run_token(config)
    finally:
        if before is None:
            os.environ.pop(RUN_TOKEN_ENV, None)
        else:
            os.environ[RUN_TOKEN_ENV] = before


def engine_token_env() -> dict[str, str]:
    """What an engine a run starts gets in its environment: the run's token as its admin token."""
    token = os.environ.get(RUN_TOKEN_ENV)
    return {"MILES_ENGINE_ADMIN_TOKEN": token} if token else {}


# the userinfo of a URL (scheme://USER:PASSWORD@host): a credential whatever the variable is called (N41)
URL_USERINFO = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://([^/?#@\s]+)@")


def url_credentials(value: str) -> list[str]:
    """The credentials inside the URLs of `value`: each `user:password` (and the password, also URL-decoded)
    of `scheme://user:password@host`; a bare `scheme://token@host` counts too. [] when none."""
    found = []
    for userinfo in URL_USERINFO.findall(value):
        found.append(userinfo)
        password = userinfo.split(":", 1)[1] if ":" in userinfo else ""
        found += [p for p in {password, unquote(password), unquote(userinfo)} if p]
    return found


def child_env(environ: dict[str, str], keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """`environ` without every variable the scrubber's name rule calls secret (key/token/secret/password) or
    whose value is a URL carrying credentials (`https://user:pass@host`, N41), except those named in `keep`:
    what a service or worker a run starts may inherit. Each launcher passes the few names its child needs
    (docs/advanced/security-probes.md lists them) and hands any secret of its own explicitly."""
    return {k: v for k, v in environ.items() if k in keep or not (is_secret_name(k) or url_credentials(v))}


def secrets_to_env(config, argv: list[str]) -> list[str]:
    """Export the parsed config's secrets to the environment; return argv without them."""
    export_secrets(config)
    return strip_secret_flags(argv)


MASK = "***"
SCRUB_SECRETS_ENV = "MILES_TRACKING_SCRUB_SECRETS"  # flag secrets the trainer hands its delivery process (a JSON list)
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


def _env_secrets(environ: dict[str, str]) -> set[str]:
    """The values of env vars whose name says key/token/secret/password, and the credentials inside any
    URL-valued one (MLFLOW_TRACKING_URI=https://user:pass@host: `user:pass` and `pass` are blanked)."""
    found = {v for k, v in environ.items() if is_secret_name(k)}
    for value in environ.values():
        found.update(url_credentials(value))
    return found


def env_scrubber() -> Scrubber:
    """The delivery process's scrubber: secret-named env vars and the secrets its trainer handed over."""
    return Scrubber(_longest_first(_env_secrets(os.environ) | set(json.loads(os.environ.get(SCRUB_SECRETS_ENV, "[]")))))


def secret_values(config: Any, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every value of a secret config field and of an env var whose name says key/token/secret/password, and
    the credentials inside URL values of either (`--mlflow-tracking-uri https://user:pass@host`)."""
    found = _env_secrets(os.environ if environ is None else environ)
    for section in config.sections():
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, str) and (f.metadata.get("secret") or is_secret_name(f.name)):
                found.add(value)
            elif isinstance(value, str):
                found.update(url_credentials(value))
    return _longest_first(found)


def scrubber_for(config: Any) -> Scrubber:
    return Scrubber(secret_values(config))


def public_params(config: Any, scrubber: Scrubber) -> dict[str, Any]:
    """The flattened config safe to store as tracker params: secret fields redacted, then scrubbed."""
    from miles.config import redacted_flat_dict  # the package imports this module

    return {k: scrubber.scrub_value(v) for k, v in redacted_flat_dict(config).items()}
