"""Training backends behind one actor interface (`base.TrainActor`); FSDP2 is the one built here."""
from __future__ import annotations

from miles.config import ConfigError

AVAILABLE = ("fsdp",)


def actor_class(train_backend: str) -> type:
    """The plain (not yet Ray-wrapped) actor class of a backend."""
    check_backend(train_backend)
    from miles.backends.fsdp.actor import FSDPTrainActor

    return FSDPTrainActor


def check_backend(train_backend: str) -> None:
    if train_backend == "megatron":
        raise ConfigError("--train-backend", "megatron is not available in this build (no Megatron-core "
                                             "backend is implemented yet); use --train-backend fsdp")
    if train_backend not in AVAILABLE:
        raise ConfigError("--train-backend", f"unknown backend {train_backend!r}; choose one of {AVAILABLE}")
