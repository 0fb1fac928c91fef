"""One "Loading weights" bar per run (B3 of the first-hour review): a training rank loads the base model
without transformers' bar, which comes back on afterwards."""
from __future__ import annotations

import torch


def test_no_loading_bar_hides_the_bar_of_a_real_load_and_restores_it(base_model, capfd):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from miles.backends.hf_weights import no_loading_bar

    hf_logging.enable_progress_bar()
    AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    assert "Loading weights" in capfd.readouterr().err  # the bar this hides, drawn by an ordinary load
    with no_loading_bar():
        AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()

