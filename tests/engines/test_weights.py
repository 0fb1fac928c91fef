"""Weight updates on a live engine: from disk and in memory, and refused when they do not fit."""
from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.engines.weights import WeightPushError, push_weights_from_disk, push_weights_in_memory

PROBE = {"text": "37+58=", "return_logprob": True,
         "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}


@pytest.fixture(scope="module")
def own_engine(base_model, tmp_path_factory):
    # Its own engine: these tests change the served weights.
    handle = launch_engine(base_model, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                           log_path=tmp_path_factory.mktemp("weights-engine") / "engine.log")
    yield handle
    assert handle.stop() is not None  # stop() ends the process


@pytest.fixture(scope="module")
def base_state(base_model):
    return AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).state_dict()


@pytest.fixture(scope="module")
def perturbed_dir(base_model, tmp_path_factory):
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(out)
    return out


def probe(url):
    out = httpx.post(url + "/generate", json=PROBE, timeout=60).json()
    return [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]], out["meta_info"]["weight_version"]


def test_disk_then_memory_update_change_outputs_and_version(own_engine, perturbed_dir, base_state):
    url = own_engine.url
    original, version = probe(url)
    assert version == "default"
    result = push_weights_from_disk(url, perturbed_dir, "v1")
    assert result.weight_version == "v1"
    changed, version = probe(url)
    assert version == "v1"
    assert max(abs(a - b) for a, b in zip(original, changed)) > 1e-3
    info = httpx.get(url + "/get_model_info").json()
    assert info["model_path"] == str(perturbed_dir) and info["weight_version"] == "v1"
    # In memory, the trainer's state dict (with the tied lm_head alias) restores the base weights exactly.
    pushed = push_weights_in_memory(url, base_state, "v2")
    assert pushed.weight_version == "v2" and pushed.bytes_sent > 0
    restored, version = probe(url)
    assert version == "v2"
    assert max(abs(a - b) for a, b in zip(original, restored)) < 1e-5


def test_partial_in_memory_update(own_engine, base_state):
    name = "model.norm.weight"
    push_weights_in_memory(own_engine.url, {name: base_state[name] * 3.0}, "v-partial")
    _, version = probe(own_engine.url)
    assert version == "v-partial"
    push_weights_in_memory(own_engine.url, base_state, "v-restored")


@pytest.fixture(scope="module")
def mismatched_dir(base_model, tmp_path_factory):
    config = Qwen3Config.from_pretrained(base_model)
    config.hidden_size, config.head_dim = 64, 16
    out = tmp_path_factory.mktemp("mismatched")
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


def test_refused_updates_leave_the_engine_serving(own_engine, mismatched_dir, tmp_path, base_state):
    url = own_engine.url
    before, version = probe(url)
    cases = [
        (lambda: push_weights_from_disk(url, tmp_path / "missing", "bad"), "does not exist"),
        (lambda: push_weights_from_disk(url, mismatched_dir, "bad"), "hidden_size"),
        (lambda: push_weights_in_memory(url, {"no.such.weight": torch.zeros(2)}, "bad"), "not a parameter"),
        (lambda: push_weights_in_memory(url, {"model.norm.weight": torch.zeros(3)}, "bad"), "has shape (3,)"),
    ]
    for push, message in cases:
        with pytest.raises(WeightPushError, match=message.replace("(", r"\(").replace(")", r"\)")):
            push()
    garbage = httpx.post(url + "/update_weights_from_tensor", content=b"not safetensors")
    assert garbage.status_code == 400 and garbage.json()["success"] is False
    no_path = httpx.post(url + "/update_weights_from_disk", json={"weight_version": "x"})
    assert no_path.status_code == 400 and "model_path" in no_path.json()["message"]
    after, version_after = probe(url)
    assert version_after == version and after == before


def test_disk_checkpoint_missing_tensors_is_refused(own_engine, base_model, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copy(base_model / "config.json", tmp_path / "config.json")
    tensors = load_file(next(base_model.glob("*.safetensors")))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightPushError, match="lacks 1 parameter"):
        push_weights_from_disk(own_engine.url, tmp_path, "bad")


def test_an_empty_tensor_set_is_refused_and_the_version_kept(own_engine):
    """E16b: a valid safetensors blob with no tensor used to be 'updated 0 tensors' and change the version."""
    from safetensors.torch import save

    before, version = probe(own_engine.url)
    empty = httpx.post(own_engine.url + "/update_weights_from_tensor", content=save({}),
                       params={"weight_version": "empty"}, headers={"content-type": "application/octet-stream"})
    assert empty.status_code == 400 and "no tensors" in empty.json()["message"], empty.text
    assert probe(own_engine.url) == (before, version)


def test_non_finite_weights_are_refused(own_engine, base_model, base_state, tmp_path):
    """E15b: an all-NaN copy of the model (from disk) or one infinite tensor (in memory) is refused; the
    served weights stay."""
    import shutil

    from safetensors.torch import save_file

    before, version = probe(own_engine.url)
    shutil.copy(base_model / "config.json", tmp_path / "config.json")
    save_file({k: torch.full_like(v, float("nan")) for k, v in base_state.items()
               if k != "lm_head.weight"}, tmp_path / "model.safetensors")  # tied: stored once, as HF does
    with pytest.raises(WeightPushError, match="NaN or infinite"):
        push_weights_from_disk(own_engine.url, tmp_path, "nan")
    bad = base_state["model.norm.weight"].clone()
    bad[0] = float("inf")
    with pytest.raises(WeightPushError, match="model.norm.weight.*NaN or infinite"):
        push_weights_in_memory(own_engine.url, {"model.norm.weight": bad}, "inf")
    assert probe(own_engine.url) == (before, version)


def test_a_weight_push_larger_than_the_model_is_refused_unread(own_engine, base_model):
    """E16b: the endpoint had no bound (200 MB read before the 400); now it reads at most the served
    model's parameters in float32 plus header room, then 413."""
    from miles.engines.weight_update import max_tensor_body

    limit = max_tensor_body(AutoModelForCausalLM.from_pretrained(base_model))
    sent = 0

    def body():
        nonlocal sent
        for _ in range(limit // 2**20 + 8):
            sent += 2**20
            yield b"\0" * 2**20

    over = httpx.post(own_engine.url + "/update_weights_from_tensor", content=body(),
                      headers={"content-type": "application/octet-stream"}, timeout=120)
    assert over.status_code == 413 and str(limit) in over.text, over.text
    # a Content-Length past the limit is answered before any byte of the body is sent
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(own_engine.url)
    with socket.create_connection((where.hostname, where.port), timeout=60) as conn:
        conn.sendall(f"POST /update_weights_from_tensor HTTP/1.1\r\nHost: {where.netloc}\r\n"
                     f"Content-Type: application/octet-stream\r\nContent-Length: {limit + 1}\r\n\r\n".encode())
        assert conn.recv(4096).startswith(b"HTTP/1.1 413")


def test_a_lone_surrogate_model_path_is_a_400_naming_it(own_engine):
    """E14: JSON's \\ud800 escape gave a 500 (the error text quoting it could not be encoded)."""
    for field in ("model_path", "weight_version"):
        body = '{"model_path": "/tmp", "weight_version": "v"}'.replace(f'"{field}": "', f'"{field}": "\\ud800')
        answer = httpx.post(own_engine.url + "/update_weights_from_disk", content=body,
                            headers={"content-type": "application/json"})
        assert answer.status_code == 400 and field in answer.json()["message"], answer.text
