"""Training backends behind one actor interface (`base.TrainActor`): FSDP2 and Megatron-core."""
from __future__ import annotations

import importlib
import importlib.util

from miles.config import ConfigError

# backend -> (module, actor class); imported only when chosen (megatron-core is heavy and optional)
ACTORS = {
    "fsdp": ("miles.backends.fsdp.actor", "FSDPTrainActor"),
    "megatron": ("miles.backends.megatron.actor", "MegatronTrainActor"),
}
AVAILABLE = tuple(ACTORS)
REQUIRES = {"megatron": ("megatron.core", "megatron-core")}  # backend -> (module it imports, pip package)


def actor_class(train_backend: str) -> type:
    """The plain (not yet Ray-wrapped) actor class of a backend."""
    check_backend(train_backend)
    module, name = ACTORS[train_backend]
    return getattr(importlib.import_module(module), name)


def check_backend(train_backend: str) -> None:
    if train_backend not in ACTORS:
        raise ConfigError("--train-backend", f"unknown backend {train_backend!r}; choose one of {AVAILABLE}")
    if train_backend in REQUIRES and not _installed(REQUIRES[train_backend][0]):
        package = REQUIRES[train_backend][1]
        raise ConfigError("--train-backend", f"{train_backend} needs {package}, which is not installed "
                                             f"(pip install {package})")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
