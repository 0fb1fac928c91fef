"""Probes N1, N2: float64 weights beyond the served dtype's range (1e300, 3.5e38 for a float32 model) are
finite in the file, so the NaN/Inf refusal let them through and the swap's cast made the model inf (200, a
new version, every token 0). Both weight-update endpoints now refuse them with a 400; weights and version kept."""
from __future__ import annotations

import shutil

import httpx
import pytest
import torch
from safetensors.torch import load_file, save, save_file

from miles.engines.weight_update import WeightUpdateError, check_tensors

from .probes import AUTH

PROBE = {"text": "37+58=", "return_logprob": True,
         "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}
TOO_BIG = [1e300, 3.5e38, -3.5e38]  # 3.5e38: just past float32's largest, 3.4028e38


def served(url: str):
    out = httpx.post(url + "/generate", json=PROBE, timeout=60).json()
    return out["output_ids"], out["meta_info"]["weight_version"]


@pytest.mark.parametrize("value", TOO_BIG)
def test_out_of_range_float64_weights_from_disk_are_refused(engine, untrained_model, tmp_path, value):
    before = served(engine.url)
    bad = tmp_path / "f64"
    shutil.copytree(untrained_model, bad)
    weights = next(bad.glob("*.safetensors"))
    state = load_file(weights)
    save_file({k: torch.full(v.shape, value, dtype=torch.float64) for k, v in state.items()}, weights)
    r = httpx.post(engine.url + "/update_weights_from_disk", headers=AUTH, timeout=120,
                   json={"model_path": str(bad), "weight_version": "f64"})
    assert r.status_code == 400, r.text
    assert "beyond the served dtype float32" in r.json()["message"] and "weights are kept" in r.json()["message"]
    assert served(engine.url) == before


@pytest.mark.parametrize("value", TOO_BIG)
def test_out_of_range_float64_weights_in_memory_are_refused(engine, value):
    before = served(engine.url)
    blob = save({"model.norm.weight": torch.full((128,), value, dtype=torch.float64)})
    r = httpx.post(engine.url + "/update_weights_from_tensor", params={"weight_version": "f64"}, content=blob,
                   headers={**AUTH, "content-type": "application/octet-stream"}, timeout=120)
    assert r.status_code == 400, r.text
    assert "'model.norm.weight'" in r.json()["message"] and "beyond the served dtype" in r.json()["message"]
    assert served(engine.url) == before


def test_the_range_check_is_the_casts_own_rule():
    """float32's largest value given in float64 fits (no over-refusal); the next float64 past the rounding
    edge does not; narrower dtypes (bfloat16 into float32) always fit."""
    model = torch.nn.Linear(2, 2, bias=False)
    f32_max = torch.finfo(torch.float32).max
    check_tensors({"weight": torch.full((2, 2), f32_max, dtype=torch.float64)}, model, require_all=False)
    check_tensors({"weight": torch.full((2, 2), -f32_max, dtype=torch.float64)}, model, require_all=False)
    check_tensors({"weight": torch.full((2, 2), 3e38, dtype=torch.bfloat16)}, model, require_all=False)
    for value in TOO_BIG:
        tensor = torch.zeros((2, 2), dtype=torch.float64)
        tensor[1, 0] = value  # one value out of range among fitting ones
        with pytest.raises(WeightUpdateError, match="'weight' holds a value of magnitude"):
            check_tensors({"weight": tensor}, model, require_all=False)
    half = torch.nn.Linear(2, 2, bias=False).to(torch.float16)
    with pytest.raises(WeightUpdateError, match="beyond the served dtype float16"):
        check_tensors({"weight": torch.full((2, 2), 70000.0)}, half, require_all=False)
