"""The rollout routing replay flags checked together: what a config alone can tell (the layout, the
record it needs). Both backends replay: miles.moe.replay on the HF model (FSDP),
miles.moe.megatron_replay through megatron-core's RouterReplay (each pipeline stage its own
layers). Whether the policy has experts is known once its checkpoint is read: the trainer's ranks
refuse a dense one (miles.moe.replay.require_routers)."""
from __future__ import annotations

from miles.config.fields import ConfigError


def check_replay_flags(train) -> None:
    """ConfigError for --use-rollout-routing-replay where it cannot do what it promises."""
    if not train.use_rollout_routing_replay:
        return
    if train.sequence_parallel:
        raise ConfigError("--use-rollout-routing-replay",
                          "with --sequence-parallel each tensor parallel rank routes its own chunk "
                          "of the sequence, which replay does not cut the records for yet")
    if not train.record_routed_experts:
        raise ConfigError("--use-rollout-routing-replay",
                          "replays the experts the engine chose, which --no-record-routed-experts "
                          "leaves out of the samples; drop one of the two")
