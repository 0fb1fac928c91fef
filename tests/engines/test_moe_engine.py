"""The embedded engine serves the tiny mixture-of-experts policy: prefill and decode with rows
joining and leaving the running batch give the logits of HF's own forward on each row's ids, and
weight updates land by the in-memory (fused expert) names from memory and from a per-expert
checkpoint."""
from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.engines.model_runner import ModelRunner
from miles.engines.weights import push_weights_from_disk, push_weights_in_memory
from miles.tiny.moe_model import NUM_EXPERTS, build_tiny_moe_model

PROBE = {"text": "37+58=", "return_logprob": True,
         "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}


def _moe(seed: int, out):
    """A fresh tiny MoE saved as save_pretrained writes it (one tensor per expert and
    projection); its routers drawn at random, so tokens spread over the experts (a zero router
    ties them all)."""
    model, tokenizer = build_tiny_moe_model(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-moe")
    _moe(0, out)
    return out


def _hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_prefill_and_continuous_decode_equal_hf_forward(moe_dir):
    runner = ModelRunner(moe_dir, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    assert runner.merges_batches
    tok = runner.tokenizer
    rows = [tok(t)["input_ids"] for t in ("12+7=", "305+48=", "9+9=")]
    late = [tok(t)["input_ids"] for t in ("4021+3=", "1+1=")]
    chosen = set()
    def keep(_module, _inputs, out):
        chosen.update(out[2].flatten().tolist())  # the router's (logits, weights, experts)

    hook = [layer.mlp.gate.register_forward_hook(keep) for layer in hf.model.layers]

    def check(logits, seqs):
        for row, seq in enumerate(seqs):
            torch.testing.assert_close(logits[row], _hf_last_logits(hf, seq), atol=1e-4, rtol=1e-4)

    logits, state = runner.prefill(rows)
    check(logits, rows)
    for step in range(4):
        if step == 2:  # two rows join the running batch, one leaves
            late_logits, late_state = runner.prefill(late)
            check(late_logits, late)
            state.merge(late_state)
            rows = rows + late
            state.keep_rows([0, 2, 3, 4])
            rows = [rows[i] for i in (0, 2, 3, 4)]
        nxt = [int(i) for i in torch.randint(3, len(tok), (len(rows),))]
        rows = [seq + [t] for seq, t in zip(rows, nxt)]
        check(runner.decode(nxt, state), rows)
    for h in hook:
        h.remove()
    assert chosen == set(range(NUM_EXPERTS))  # every expert served a token: a real choice


def _probe(url):
    out = httpx.post(url + "/generate", json=PROBE, timeout=60).json()
    meta = out["meta_info"]
    return [lp for lp, _, _ in meta["output_token_logprobs"]], meta["weight_version"]


def test_weight_updates_land_from_disk_and_memory(moe_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).state_dict()
    other = _moe(1, tmp_path / "other")  # per-expert names on disk, other values everywhere
    handle = launch_engine(moe_dir, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                           log_path=tmp_path / "engine.log")
    try:
        original, _ = _probe(handle.url)
        assert push_weights_from_disk(handle.url, tmp_path / "other", "v1").weight_version == "v1"
        from_disk, version = _probe(handle.url)
        assert version == "v1" and max(abs(a - b) for a, b in zip(original, from_disk)) > 1e-3
        fused = {k: v for k, v in other.state_dict().items()}  # the in-memory names: experts fused
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in fused)
        push_weights_in_memory(handle.url, base, "v2")
        restored, version = _probe(handle.url)
        assert version == "v2" and restored == original
        push_weights_in_memory(handle.url, fused, "v3")
        assert _probe(handle.url) == (from_disk, "v3")  # the same weights by either path
    finally:
        handle.stop()
