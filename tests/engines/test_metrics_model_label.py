"""The engine's `/metrics` label a model by its folder's name, not the absolute path (issue 55,
review N26: every series read `model_name="<home>/.cache/miles/tiny-base-..."`)."""
from __future__ import annotations

from miles.engines.metrics import EngineMetrics, model_label


def test_a_path_is_labelled_by_its_folder_and_a_hub_id_stays():
    assert model_label("/home/someone/.cache/miles/tiny-base-ad237a38a6") == "tiny-base-ad237a38a6"
    assert model_label("/home/someone/.cache/miles/tiny-base-ad237a38a6/") == "tiny-base-ad237a38a6"
    assert model_label("./runs/x/checkpoints/iter_0000099") == "iter_0000099"
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert model_label(hub_id) == hub_id
    assert model_label("/") == "/"


def test_the_scrape_carries_no_home_path():
    metrics = EngineMetrics(model_name="/home/someone/.cache/miles/tiny-base-ad237a38a6")
    metrics.num_requests.inc()
    text = metrics.render().decode()
    assert 'model_name="tiny-base-ad237a38a6"' in text
    assert "/home/someone" not in text
