"""The rollout routing replay flags checked together: what a config alone can tell (the backend, the
record it needs). Whether the policy has experts is known once its checkpoint is read: the trainer's
ranks refuse a dense one (miles.moe.replay.require_routers)."""
from __future__ import annotations

from miles.config.fields import ConfigError

# Backends whose training passes can replay the engine's routing (miles.moe.replay on the HF model).
REPLAY_BACKENDS = ("fsdp",)


def check_replay_flags(train) -> None:
    """ConfigError for --use-rollout-routing-replay where it cannot do what it promises."""
    if not train.use_rollout_routing_replay:
        return
    if train.train_backend not in REPLAY_BACKENDS:
        raise ConfigError("--use-rollout-routing-replay",
                          f"is built for --train-backend {' or '.join(REPLAY_BACKENDS)} only; the "
                          f"{train.train_backend} backend's routers do not replay the engine's routing yet")
    if not train.record_routed_experts:
        raise ConfigError("--use-rollout-routing-replay",
                          "replays the experts the engine chose, which --no-record-routed-experts "
                          "leaves out of the samples; drop one of the two")
