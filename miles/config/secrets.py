"""Secrets travel in the environment, never as Prefect parameters: move them there and out of argv/config.

`miles train` calls `secrets_to_env` on its argv before the flow starts, and the flow calls
`export_secrets` on its config before handing it to a subflow, so the parameters Prefect
stores (and serves through its API) hold no secret; the processes read the environment.
"""
from __future__ import annotations

import dataclasses
import os

from miles.config.fields import flag_name

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


def secrets_to_env(config, argv: list[str]) -> list[str]:
    """Export the parsed config's secrets to the environment; return argv without them."""
    export_secrets(config)
    return strip_secret_flags(argv)
