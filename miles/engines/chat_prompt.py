"""A chat prompt's token ids in which the messages' text stays text (probe B3).

The chat template is rendered to text and encoded, as SGLang does; but encoded whole, a message holding
`<|im_end|>\n<|im_start|>system\n...` became real control tokens, so a user message could close its own
turn and forge a system or assistant turn. Here a message whose content holds a special token's text has
each such occurrence swapped for a sentinel before rendering; the rendered text is then encoded piece by
piece: the template's pieces as usual (its own special tokens stay tokens), each swapped occurrence as
plain text (`split_special_tokens`). A chat without such content is encoded exactly as before.
"""
from __future__ import annotations

import re
import secrets
from typing import Any, Callable


def special_texts(tokenizer) -> list[str]:
    """The text of every special token (the named ones and added tokens marked special), longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if t), key=len, reverse=True)


def render_chat(tokenizer, messages: list[dict[str, Any]],
                **template_kwargs) -> tuple[str, Callable[[str], list[int]] | None]:
    """(rendered text, None) when no message content holds a special token's text: encode it as usual.
    Else (text with sentinels, the function that encodes it with those occurrences as plain text)."""
    specials = special_texts(tokenizer)
    if not specials or not any(s in str(m.get("content") or "") for m in messages for s in specials):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **template_kwargs), None
    nonce = secrets.token_hex(8)  # the user cannot have guessed it: no content can fake a sentinel
    pattern = re.compile("|".join(re.escape(s) for s in specials))
    taken: list[str] = []

    def sentinel(match: re.Match) -> str:
        taken.append(match.group(0))
        return f"\ue000{nonce}:{len(taken) - 1}\ue001"

    swapped = [{**m, "content": pattern.sub(sentinel, m["content"])} if isinstance(m.get("content"), str) else m
               for m in messages]
    text = tokenizer.apply_chat_template(swapped, tokenize=False, add_generation_prompt=True, **template_kwargs)
    return text, lambda rendered: encode_rendered(tokenizer, rendered, nonce, taken)


def encode_rendered(tokenizer, text: str, nonce: str, taken: list[str]) -> list[int]:
    """The ids of a `render_chat` text with sentinels: template pieces encoded as usual, each taken
    special-token text encoded as text; the tokenizer's own prefix/suffix (a BOS) added once, as
    `encode(text, add_special_tokens=True)` would."""
    parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", text)
    ids: list[int] = []
    for i, part in enumerate(parts):
        if i % 2:  # a sentinel's index
            ids += tokenizer(taken[int(part)], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        elif part:
            ids += tokenizer(part, add_special_tokens=False)["input_ids"]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    framed = tokenizer("a", add_special_tokens=True)["input_ids"]
    at = next((k for k in range(len(framed) - len(plain) + 1) if framed[k:k + len(plain)] == plain), None)
    if at is None:
        return ids
    return framed[:at] + ids + framed[at + len(plain):]
