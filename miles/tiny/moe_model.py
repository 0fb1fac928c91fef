"""The tiny mixture-of-experts policy: a Qwen3-MoE causal LM built from a config, no download.

The dense tiny policy's shape (miles.tiny.model) with its MLP split into experts: 4 experts of
192 hidden units, 2 chosen per token, so a token passes through as many MLP units (2 x 192) as
the dense model's 384. Small enough for CPU tests, big enough that routing is a real choice.
"""
from __future__ import annotations

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from miles.tiny.model import seeded_model, tiny_shape_fields
from miles.tiny.tokenizer import EOS, PAD, build_tokenizer

NUM_EXPERTS = 4
TOP_K = 2


def tiny_qwen3_moe_config(vocab_size: int, pad_id: int, eos_id: int) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        **tiny_shape_fields(vocab_size, pad_id, eos_id),  # its intermediate_size is unused here:
        moe_intermediate_size=192,  # every layer is sparse (decoder_sparse_step=1)
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,  # as Qwen3-30B-A3B: the chosen experts' weights sum to 1
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.001,
    )


def tiny_moe_shape() -> tuple:
    """(tokenizer, model config) of the tiny MoE policy, in memory."""
    tokenizer = build_tokenizer(False)
    return tokenizer, tiny_qwen3_moe_config(len(tokenizer), tokenizer.convert_tokens_to_ids(PAD),
                                            tokenizer.convert_tokens_to_ids(EOS))


def build_tiny_moe_model(seed: int = 0):
    """A freshly initialised tiny Qwen3-MoE and its tokenizer."""
    tokenizer, config = tiny_moe_shape()
    return seeded_model(Qwen3MoeForCausalLM, config, seed), tokenizer
