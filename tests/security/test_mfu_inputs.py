"""Probes MF2 and MF3: MFU from shapes no model has and from peaks no rank measured. A config with -3
layers, 10**6 KV heads or a vocabulary of 10**30 gave an MFU of -0.02, 629 or 4.9e24, and hidden_size
1e400 an OverflowError the trainer does not catch; a rank peak of 0 or NaN gave a false rank MFU of 0.0.
Now the shape is a ValueError (the trainer's "no perf/mfu"), and a rank without a measured peak has no
MFU point."""
from __future__ import annotations

import json
import math

import pytest

from miles.backends.flops import ModelShape, mfu_metrics


@pytest.fixture
def config(untrained_model) -> dict:
    return json.loads((untrained_model / "config.json").read_text())


@pytest.mark.parametrize("key, value", [("num_hidden_layers", -3), ("num_key_value_heads", 10**6),
                                        ("vocab_size", 10**30), ("hidden_size", float("inf")),
                                        ("num_attention_heads", 0), ("intermediate_size", 0)])
def test_a_shape_no_model_has_is_a_value_error(config, key, value):
    with pytest.raises(ValueError, match="the model config"):
        ModelShape.from_config({**config, key: value})


def test_a_rank_without_a_measured_peak_has_no_mfu(config):
    shape = ModelShape.from_config(config)
    for peak in (0.0, float("nan")):
        out = mfu_metrics(shape, [[40] * 8], [0.5], [peak])
        assert "perf/rank_0_mfu" not in out and "perf/mfu" not in out, out
    out = mfu_metrics(shape, [[40] * 8, [40] * 8], [0.5, 0.5], [1e11, 0.0])
    assert "perf/rank_1_mfu" not in out and out["perf/mfu"] == pytest.approx(out["perf/rank_0_mfu"])
    assert mfu_metrics(shape, [[40] * 8], [float("nan")], [1e11]) == {}
    assert all(math.isfinite(v) for v in mfu_metrics(shape, [[40] * 8], [0.5], [1e11]).values())
