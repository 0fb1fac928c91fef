"""The training ranks' layout: tensor x pipeline x data parallel, and what the flags may ask for.

World = --actor-num-nodes x --actor-num-gpus-per-node training ranks = TP x PP x DP. Only the
Megatron backend shards a model over TP and PP (FSDP shards by data parallel only). Expert
parallel (EP, MoE models) splits the experts over EP ranks carved out of DP, as megatron-core
lays them out: DP must divide by EP. What the model must divide (heads and KV heads by TP, layers
by PP, experts by EP; EP needs experts) is checked against its HF config in
`miles.preflight.check_parallel_layout`, before anything starts.
"""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError

TP_FLAG, PP_FLAG, SP_FLAG = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                             "--sequence-parallel")
EP_FLAG = "--expert-model-parallel-size"


@dataclass(frozen=True)
class RankLayout:
    """How many ways the model and the data are split; tp x pp x dp = the training ranks."""

    tp: int
    pp: int
    dp: int

    def describe(self) -> str:
        return f"TP={self.tp} x PP={self.pp} x DP={self.dp}"


def rank_layout(train) -> RankLayout:
    """The layout of a TrainConfig's ranks (checked: `check_parallel_flags`)."""
    world = train.actor_num_nodes * train.actor_num_gpus_per_node
    tp, pp = train.tensor_model_parallel_size, train.pipeline_model_parallel_size
    return RankLayout(tp, pp, world // (tp * pp))


def check_parallel_flags(train) -> None:
    """The parallel flags of a TrainConfig, on their own: ConfigError naming the flag."""
    tp, pp = train.tensor_model_parallel_size, train.pipeline_model_parallel_size
    world = train.actor_num_nodes * train.actor_num_gpus_per_node
    flag = TP_FLAG if tp > 1 else PP_FLAG
    if train.train_backend == "fsdp" and (tp > 1 or pp > 1):
        raise ConfigError(flag, f"FSDP shards by data parallel only; use --train-backend megatron "
                                f"for tensor or pipeline parallel (got TP={tp}, PP={pp})")
    if world % (tp * pp):
        raise ConfigError(flag, f"the {world} training ranks (--actor-num-nodes x "
                                f"--actor-num-gpus-per-node) must divide by TP x PP = {tp} x {pp}; "
                                "DP = ranks / (TP x PP)")
    if train.sequence_parallel and tp == 1:
        raise ConfigError(SP_FLAG, "sequence parallel splits activations over the tensor parallel "
                                   "ranks: it needs --tensor-model-parallel-size > 1")
    check_expert_flag(train)


def check_expert_flag(train) -> None:
    """--expert-model-parallel-size against the backend and the ranks (megatron-core's layout:
    the world divides by expert TP (= TP) x EP x PP, so the DP ranks divide by EP)."""
    ep = train.expert_model_parallel_size
    if ep == 1:
        return
    if train.train_backend != "megatron":
        raise ConfigError(EP_FLAG, f"expert parallel is built for --train-backend megatron only "
                                   f"(got --train-backend {train.train_backend}, EP={ep})")
    layout = rank_layout(train)
    if layout.dp % ep:
        raise ConfigError(EP_FLAG, f"the {layout.dp} data parallel ranks (training ranks / (TP x "
                                   f"PP)) must divide by the expert parallel size {ep}: "
                                   "megatron-core carves the EP ranks out of them")


def check_model_experts(ep: int, experts: int, tp: int = 1, sp: bool = False) -> None:
    """--expert-model-parallel-size against the model: it needs experts, and they split evenly.
    A MoE model with TP > 1: megatron-core's MoE layer refuses to train without sequence
    parallel."""
    if experts and tp > 1 and not sp:
        raise ConfigError(SP_FLAG, f"a mixture-of-experts model at TP={tp} needs "
                                   "--sequence-parallel: megatron-core's MoE layer trains with "
                                   "tensor parallel only when the sequence is split too")
    if ep > 1 and not experts:
        raise ConfigError(EP_FLAG, f"expert parallel size {ep} needs a mixture-of-experts model; "
                                   "this one is dense")
    if ep > 1 and experts % ep:
        raise ConfigError(EP_FLAG, f"the model's {experts} experts must divide by the expert "
                                   f"parallel size {ep}")


def check_model_divides(layout: RankLayout, heads: int, kv_heads: int, ffn: int,
                        layers: int) -> None:
    """The model's shape against the layout (what megatron-core's parallel layers split evenly):
    ConfigError naming the flag whose size does not fit."""
    for count, what in ((heads, "attention heads"), (kv_heads, "KV heads (query groups)"),
                        (ffn, "MLP intermediate size")):
        if count % layout.tp:
            raise ConfigError(TP_FLAG, f"the model's {what} ({count}) must divide by the tensor "
                                       f"parallel size {layout.tp}")
    if layers % layout.pp:
        raise ConfigError(PP_FLAG, f"the model's {layers} layers must divide by the pipeline "
                                   f"parallel size {layout.pp} (megatron-core's even split)")
