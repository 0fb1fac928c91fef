"""One cached loader for `--custom-*-path` hooks given as dotted paths (`pkg.mod.fn`)."""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable

from miles.config import ConfigError


def load_object(path: str, flag: str):
    """The attribute `obj` of `pkg.mod.obj`, or None when the module has no such attribute."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(flag, f"{path!r} is not a dotted path like pkg.module.name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(flag, f"cannot import module {module_name!r} of {path!r}: {exc}") from None
    return getattr(module, attr, None)


@functools.lru_cache(maxsize=None)
def load_function(path: str, flag: str, num_params: int, is_async: bool = False) -> Callable:
    """Import `pkg.mod.fn` and check it takes `num_params` positional arguments (and is `async def`)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(flag, f"{path!r} is not a dotted path like pkg.module.function")
    fn = load_object(path, flag)
    if not callable(fn):
        raise ConfigError(flag, f"{module_name!r} has no function {attr!r}")
    if is_async and not inspect.iscoroutinefunction(fn):
        raise ConfigError(flag, f"{path} must be an async function (async def)")
    try:
        inspect.signature(fn).bind(*range(num_params))
    except TypeError:
        raise ConfigError(flag, f"{path} must accept {num_params} positional arguments, "
                                f"its signature is {inspect.signature(fn)}") from None
    return fn
