"""Hold the served HF checkpoint on its device and run batched prefill and decode steps with a KV cache.

The runner knows nothing about requests or HTTP: it takes token ids and masks, gives
logits, and swaps in new weights when the scheduler says it is safe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import DynamicLayer

from miles.engines.routing_capture import RoutingCapture
from miles.engines.weight_update import check_served_finite


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--engine-device cuda was asked for but no CUDA device is available")
    return torch.device(device)


@dataclass
class StepState:
    """A running batch on the device: (C, T) attention mask, (C, 1) next positions, the KV cache
    of C cache rows, and `slots`, the cache row of each of the batch's B rows (B >= C).

    Rows that have read the same tokens (a GRPO group's samples, until they part ways) share one
    cache row, and the model runs it once per step: their logits are the same. Rows join
    (`merge`) and leave (`keep_rows`) between decode steps: the continuous batch."""

    attention_mask: torch.Tensor
    next_positions: torch.Tensor
    cache: DynamicCache
    slots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.slots:
            self.slots = list(range(self.attention_mask.shape[0]))

    def keep_rows(self, rows: list[int]) -> None:
        self.slots = [self.slots[i] for i in rows]
        used = sorted(set(self.slots))
        if len(used) < self.attention_mask.shape[0]:  # cache rows no row reads any more leave
            renumber = {old: new for new, old in enumerate(used)}
            self.slots = [renumber[s] for s in self.slots]
            self.select_cache_rows(used)
        self._drop_empty_columns()

    def select_cache_rows(self, rows: list[int]) -> None:
        """Keep (or copy) cache rows `rows`, in that order; the caller renumbers `slots`."""
        index = torch.tensor(rows, device=self.attention_mask.device)
        self.attention_mask = self.attention_mask[index]
        self.next_positions = self.next_positions[index]
        for layer in self.cache.layers:
            layer.batch_select_indices(index)

    def merge(self, other: "StepState") -> None:
        """Append the rows of `other` (a batch prefilled just now) to this running batch.

        Both are left-padded; the shorter one gets more left padding (masked out, zero K/V) so the
        time axes line up. Positions are per row, so a row's logits do not depend on the padding."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        self.slots = self.slots + [s + self.attention_mask.shape[0] for s in other.slots]
        self.attention_mask = torch.cat([_left_pad(self.attention_mask, width), _left_pad(other.attention_mask, width)])
        self.next_positions = torch.cat([self.next_positions, other.next_positions])
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            for name in ("keys", "values"):
                a, b = getattr(mine, name), getattr(theirs, name)
                setattr(mine, name, torch.cat([_left_pad(a, width, dim=2), _left_pad(b, width, dim=2)]))

    def _drop_empty_columns(self) -> None:
        """Once the longest rows have left, the leading columns are padding in every row: cut them, so
        the cache and each step's attention stay as wide as the rows still running need."""
        used = self.attention_mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start == 0:
            return
        self.attention_mask = self.attention_mask[:, start:]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]


def _left_pad(t: torch.Tensor, width: int, dim: int = 1) -> torch.Tensor:
    """`t` with zeros prepended along `dim` up to `width`."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class ModelRunner:
    def __init__(self, model_path: str | Path, device: str = "auto", context_length: int | None = None,
                 cpu_threads: int | None = None, dtype: str = "auto"):
        self.device = pick_device(device)
        if cpu_threads is not None:
            torch.set_num_threads(cpu_threads)
        # auto: fp32 on CPU so log-probs match a trainer's fp32 recomputation; the checkpoint's dtype on GPU.
        if dtype == "auto":
            self.dtype = torch.float32 if self.device.type == "cpu" else "auto"
        else:
            self.dtype = getattr(torch, dtype)
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).to(self.device).eval()
        self.dtype = next(self.model.parameters()).dtype
        check_served_finite(self.model, self.model_path)  # NaN/Inf weights are refused at start, as in an update
        self.config = self.model.config
        self.routing = RoutingCapture(self.model)  # the experts each forward chose (MoE models)
        self.context_length = context_length or model_context_length(self.config, self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = _eos_ids(self.config, self.tokenizer, model_path)
        # Rows can join a running batch only when every cache layer is a plain full-attention one
        # (`StepState.merge` pads along time; a sliding-window layer keeps a window it cannot pad).
        self.merges_batches = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.config).layers)

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, StepState]:
        """Left-pad the prompts into one batch, run it, return the last-position logits (B, V).

        Equal rows (a GRPO group's samples share their prompt) are run once and share one cache
        row (SGLang shares such a prefix through its radix cache); each gets the logits and routing
        record: the default rollout's 256 rows are 32 prompts (the prefill was a third of the
        engine's time)."""
        unique, rows = _distinct(prompts)
        logits, state = self._prefill(unique)
        state.slots = rows
        return self._rows_of(logits, rows), state

    def _rows_of(self, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """The batch's rows of a forward over its distinct cache rows (logits, routing records)."""
        if len(slots) == logits.shape[0] and slots == list(range(len(slots))):
            return logits
        index = torch.tensor(slots, device=logits.device)
        self.routing.select_rows(index, logits.shape[0])
        return logits[index]

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, StepState]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # real tokens count from 0 under left padding
        cache = DynamicCache(config=self.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                         logits_to_keep=1)
        state = StepState(attention_mask=mask, next_positions=positions[:, -1:] + 1, cache=cache)
        return out.logits[:, -1], state

    @torch.no_grad()
    def decode(self, tokens: list[int], state: StepState) -> torch.Tensor:
        """Feed one new token per row; returns the next logits (B, V). Rows that shared a cache row
        and feed the same token go on sharing one; those that feed different tokens part ways (their
        cache row is copied)."""
        first: dict[tuple[int, int], int] = {}
        slots = [first.setdefault(pair, len(first)) for pair in zip(state.slots, tokens)]
        parents = [slot for slot, _ in first]
        if parents != list(range(state.attention_mask.shape[0])):
            state.select_cache_rows(parents)
        state.slots = slots
        return self._rows_of(self._decode([token for _, token in first], state), slots)

    def _decode(self, tokens: list[int], state: StepState) -> torch.Tensor:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        ones = torch.ones((len(tokens), 1), dtype=torch.long, device=self.device)
        state.attention_mask = torch.cat([state.attention_mask, ones], dim=1)
        out = self.model(input_ids=ids, attention_mask=state.attention_mask, position_ids=state.next_positions,
                         cache=state.cache, use_cache=True)
        state.next_positions = state.next_positions + 1
        return out.logits[:, -1]

    @torch.no_grad()
    def load_weights(self, named: dict[str, torch.Tensor]) -> None:
        """Copy already-checked tensors into the live parameters (call only while no request runs)."""
        live = self.model.state_dict()
        for name, tensor in named.items():
            live[name].copy_(tensor.to(device=live[name].device, dtype=live[name].dtype))


def _distinct(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in first-seen order, and for each prompt the index of its distinct one."""
    first: dict[tuple[int, ...], int] = {}
    rows = [first.setdefault(tuple(p), len(first)) for p in prompts]
    unique = [list(key) for key in first]
    return unique, rows


def model_context_length(config, tokenizer) -> int:
    for name in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return int(tokenizer.model_max_length)


def _eos_ids(config, tokenizer, model_path) -> tuple[int, ...]:
    """Every id that ends a response: the model config's, the generation config's (as SGLang reads it:
    chat checkpoints list their end-of-turn token there) and the tokenizer's, in that order, once each."""
    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        generation = None
    ids: list[int] = []
    for eos in (config.eos_token_id, generation, tokenizer.eos_token_id):
        for i in eos if isinstance(eos, (list, tuple)) else [eos]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)

