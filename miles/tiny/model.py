"""The tiny policy: a Qwen3-architecture causal LM built from a config, no download."""
from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from miles.tiny.tokenizer import EOS, PAD, build_tokenizer


def tiny_shape_fields(vocab_size: int, pad_id: int, eos_id: int) -> dict:
    """What the tiny policies share, dense and MoE: size, attention, tokens, dtype."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        torch_dtype="float32",
    )


def tiny_qwen3_config(vocab_size: int, pad_id: int, eos_id: int) -> Qwen3Config:
    return Qwen3Config(**tiny_shape_fields(vocab_size, pad_id, eos_id))


def tiny_shape(tool_markers: bool = False) -> tuple:
    """(tokenizer, model config) of the tiny policy, in memory: fixed by its recipe, known before the warm
    start makes its weights (a run's flags are checked against its context length before that wait)."""
    tokenizer = build_tokenizer(tool_markers)
    return tokenizer, tiny_qwen3_config(len(tokenizer), tokenizer.convert_tokens_to_ids(PAD),
                                        tokenizer.convert_tokens_to_ids(EOS))


def build_tiny_model(seed: int = 0, tool_markers: bool = False):
    """A freshly initialised tiny Qwen3 and its tokenizer (with the tool tokens if asked)."""
    tokenizer, config = tiny_shape(tool_markers)
    return seeded_model(Qwen3ForCausalLM, config, seed), tokenizer


def seeded_model(model_class, config, seed: int):
    """`model_class(config)` initialised from `seed`, generating until the config's EOS."""
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model
