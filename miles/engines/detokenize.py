"""Turn output token ids into response text the way SGLang does: stop strings and stop tokens trimmed.

`IncrementalText` gives streaming deltas that never have to be taken back: it holds back
text that could still become a stop string or an unfinished multi-byte character.
"""
from __future__ import annotations

from miles.engines.sglang_request import FinishReason, SamplingParams


def final_text(tokenizer, output_ids: list[int], params: SamplingParams, finish: FinishReason | None) -> str:
    ids = output_ids
    trim = finish is not None and finish.type == "stop" and not params.no_stop_trim
    if trim and isinstance(finish.matched, int) and ids:
        ids = ids[:-1]  # the EOS / stop token itself is not part of the text
    text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
    if trim and isinstance(finish.matched, str):
        cut = text.find(finish.matched)
        text = text[:cut] if cut >= 0 else text
    return text


class IncrementalText:
    def __init__(self, tokenizer, params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.sent = ""
        self.holdback = max((len(s) for s in params.stop), default=1) - 1

    def update(self, output_ids: list[int]) -> str:
        """The new text that is safe to show after these tokens."""
        text = self.tokenizer.decode(output_ids, skip_special_tokens=self.params.skip_special_tokens)
        safe = text[: len(text) - self.holdback] if self.holdback else text
        safe = safe.rstrip("\ufffd")  # an incomplete UTF-8 sequence; its character comes with the next token
        return self._advance(safe)

    def finish(self, output_ids: list[int], finish: FinishReason) -> str:
        return self._advance(final_text(self.tokenizer, output_ids, self.params, finish))

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta
