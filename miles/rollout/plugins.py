"""One cached loader for `--custom-*-path` hooks given as dotted paths (`pkg.mod.fn`)."""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable

from miles.config import ConfigError


@functools.lru_cache(maxsize=None)
def load_function(path: str, flag: str, num_params: int) -> Callable:
    """Import `pkg.mod.fn` and check it takes `num_params` positional arguments."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(flag, f"{path!r} is not a dotted path like pkg.module.function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(flag, f"cannot import module {module_name!r} of {path!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(flag, f"{module_name!r} has no function {attr!r}")
    try:
        inspect.signature(fn).bind(*range(num_params))
    except TypeError:
        raise ConfigError(flag, f"{path} must accept {num_params} positional arguments, "
                                f"its signature is {inspect.signature(fn)}") from None
    return fn
