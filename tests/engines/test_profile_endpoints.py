"""SGLang's /start_profile and /stop_profile on the embedded engine: a Chrome trace of the decode work
between them, SGLang's file naming, and clear 400s for misuse and for knobs the engine lacks."""
import gzip
import json


def test_start_generate_stop_writes_a_trace_of_the_model(client, tmp_path):
    body = {"output_dir": str(tmp_path), "profile_id": "window", "profile_prefix": "engine0",
            "activities": ["CPU", "GPU"], "record_shapes": True}
    started = client.post("/start_profile", json=body)
    assert started.status_code == 200, started.text
    assert client.post("/start_profile", json=body).status_code == 400  # one profile at a time
    assert client.post("/generate", json={"text": "12+7=", "sampling_params": {"max_new_tokens": 4}}).status_code == 200
    stopped = client.post("/stop_profile")
    assert stopped.status_code == 200, stopped.text
    path = tmp_path / "engine0-window-TP-0.trace.json.gz"
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert "aten::linear" in ops or "aten::mm" in ops  # the model's forward, run on the scheduler thread
    assert client.post("/stop_profile").status_code == 400  # nothing running any more


def test_unsupported_profile_requests_are_rejected(client, tmp_path):
    for body, param in (({"num_steps": 5}, "num_steps"), ({"profile_by_stage": True}, "profile_by_stage"),
                        ({"activities": ["RPD"]}, "activities")):
        answer = client.post("/start_profile", json={"output_dir": str(tmp_path), **body})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param
    assert client.post("/stop_profile").status_code == 400  # none of them started a profile
