"""A character-level tokenizer built with `tokenizers`, saved as an ordinary HF tokenizer.

Each printable ASCII character is one token, so a tiny model can learn arithmetic
without any download; the Qwen-style chat markers are special tokens.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [PAD, BOS, EOS]
# Qwen's tool markers: one token each, and ordinary text (decoding keeps them), as in Qwen's vocabulary.
TOOL_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 96 characters incl. space and newline

# Qwen's template, so SGLang and `apply_chat_template` treat the checkpoint like a Qwen one.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# The multi-turn tool task's template: raw text, a tool message wrapped in <tool_response>, so a chat
# request renders exactly the token stream the multi-turn rollout builds (assistant tool calls arrive
# already rendered as text by the tool-call parser).
TOOL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ '<tool_response>' + message['content'] + '</tool_response>' }}"
    "{% elif message['role'] != 'system' %}{{ message['content'] }}{% endif %}"
    "{% endfor %}"
)


def build_tokenizer(tool_markers: bool = False) -> PreTrainedTokenizerFast:
    """The character tokenizer; with `tool_markers`, also the four tool tokens and the tool chat template."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split every character into its own token, keeping it (not a separator).
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=None,
                                  unk_token=PAD, additional_special_tokens=[BOS])
    tok.chat_template = CHAT_TEMPLATE
    if tool_markers:
        tok.add_tokens(TOOL_MARKERS)
        tok.chat_template = TOOL_CHAT_TEMPLATE
    tok.model_max_length = 256
    return tok
