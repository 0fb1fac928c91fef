"""The peak perf/mfu divides by is recorded (review N25: MFU at 0.252 implied a CPU peak of 0.066 TFLOP/s
that no journal key, tag or log line gave, so two runs' MFU could not be compared): the first iteration
journals `perf/rank_<r>_peak_tflops`, and the trainer's line says whether each is measured or a data sheet's."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from miles.backends.flops import IterationFlops

CONFIG = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 128, "vocab_size": 100}


class Ranks:
    """Two ranks' `info`: one GPU from the table, one CPU measured; counts the calls."""

    def __init__(self):
        self.calls = 0

    def call(self, method):
        assert method == "info"
        self.calls += 1
        return [SimpleNamespace(extra={"peak_flops": 989e12, "peak_source": "table:NVIDIA H100 80GB HBM3"}),
                SimpleNamespace(extra={"peak_flops": 6.6e10, "peak_source": "measured:cpu-fp32-matmul"})]


def test_the_first_iteration_journals_each_ranks_peak_and_says_where_it_came_from(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    ranks = Ranks()
    flops = IterationFlops(tmp_path, ranks)
    batches = [SimpleNamespace(tokens=[[1] * 10, [1] * 12])] * 2
    results = [SimpleNamespace(actor_train_time=0.5)] * 2
    first, second = flops.metrics(batches, results), flops.metrics(batches, results)
    assert first["perf/rank_0_peak_tflops"] == pytest.approx(989.0)
    assert first["perf/rank_1_peak_tflops"] == pytest.approx(0.066)
    # once is enough: later iterations carry MFU alone, and the ranks are asked once
    assert not any(k.endswith("_peak_tflops") for k in second) and "perf/mfu" in second
    assert ranks.calls == 1
    line = capsys.readouterr().out
    assert "rank 0 989 TFLOP/s (data sheet: NVIDIA H100 80GB HBM3)" in line
    assert "rank 1 0.066 TFLOP/s (measured: cpu-fp32-matmul)" in line
