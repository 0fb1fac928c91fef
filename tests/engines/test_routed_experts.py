"""The embedded engine's `return_routed_experts` (SGLang's request field): each request gets the
experts its own tokens were routed to, through prefill, decode and continuous batching with left
padding; a dense model refuses the field with a 400 naming it; the rollout reads the answer back."""
from __future__ import annotations

import base64
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from miles.config import EngineConfig
from miles.engines.metrics import EngineMetrics
from miles.engines.model_runner import ModelRunner
from miles.engines.routing_capture import RoutingCapture, compact_dtype
from miles.engines.scheduler import Scheduler
from miles.engines.server import EngineServer
from miles.rollout.routed_experts import RoutedExpertsError, read_routed_experts, wanted_routing
from tests.support.in_process_engine import TIMEOUT_S, Tracked, params, prompt


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from miles.tiny.moe_model import build_tiny_moe_model
    from miles.tiny.warmstart import save_checkpoint

    out = tmp_path_factory.mktemp("moe") / "model"
    save_checkpoint(*build_tiny_moe_model(0), out)
    return out


@pytest.fixture(scope="module")
def moe_runner(moe_dir):
    return ModelRunner(moe_dir, device="cpu")


def alone_routing(runner: ModelRunner, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The routers' choice over `ids` in one plain forward (sorted per token), and each choice's
    margin: the k-th probability minus the next one (a near-tie may go either way in another
    batch)."""
    out: list = []
    hooks = [r.register_forward_hook(lambda m, i, o: out.append(o)) for r in runner.routing.routers]
    with torch.no_grad():
        runner.model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    chosen = torch.stack([o[2] for o in out], dim=1).sort(-1).values.numpy()
    probs = torch.stack([torch.softmax(o[0], -1) for o in out], dim=1)
    probs = probs.sort(-1, descending=True).values
    k = chosen.shape[-1]
    return chosen, (probs[..., k - 1] - probs[..., k]).numpy()


def test_each_request_gets_its_own_tokens_routing_in_a_continuous_batch(moe_runner):
    """Six requests of different prompt lengths join a running batch at different steps (left
    padding, rows leaving), one of them not asking; every record is (prompt + output - 1, layers,
    top_k) and holds what the routers choose for those tokens alone."""
    scheduler = Scheduler(moe_runner, EngineMetrics(model_name="t"), max_batch_size=8,
                          max_queued=64)
    scheduler.start()
    texts = ["what is 12+13? 12+13=", "1+2=", "hello 99+1=", "7+", "37+58=", "5+5+5="]
    tracked = [Tracked(scheduler, f"r{i}", prompt(moe_runner, t), params(4 + 3 * i, seed=i))
               for i, t in enumerate(texts)]
    for i, t in enumerate(tracked):
        t.request.return_routed_experts = i != 2
    for i in range(len(tracked) - 1):  # request i+1 arrives at token 2 of request i
        tracked[i].on_token(2, tracked[i + 1].submit)
    try:
        tracked[0].submit()
        results = [t.result() for t in tracked]
        assert scheduler.stats().num_joined_running >= 1
    finally:
        scheduler.stop()
    layers, top_k = len(moe_runner.routing.routers), moe_runner.routing.top_k
    assert results[2].routed_experts is None
    for i, r in enumerate(results):
        if i == 2:
            continue
        ids = r.prompt_ids + r.output_ids[:-1]  # the last token is never read
        assert r.routed_experts.shape == (len(ids), layers, top_k)
        assert r.routed_experts.dtype == np.int8  # 4 experts
        alone, margin = alone_routing(moe_runner, ids)
        clear = margin > 1e-5
        assert clear.mean() > 0.9
        assert (np.sort(r.routed_experts, -1) == alone).all(-1)[clear].all(), f"request {i}"


def test_a_retracted_request_keeps_a_whole_record(moe_runner):
    """SGLang's `retract` pause puts a running request back in the queue; re-admitted, it is
    prefilled again from prompt + tokens so far: its record restarts there and still covers every
    token it read once, as its routers choose them alone."""
    scheduler = Scheduler(moe_runner, EngineMetrics(model_name="t"), max_batch_size=8,
                          max_queued=64)
    scheduler.start()
    asked: Future = Future()
    request = Tracked(scheduler, "retracted", prompt(moe_runner, "12+34="), params(12, seed=3))
    request.request.return_routed_experts = True
    request.on_token(5, lambda: asked.set_result(scheduler.pause("retract")))
    try:
        request.submit()
        assert asked.result(timeout=TIMEOUT_S).result(timeout=TIMEOUT_S) == 1
        assert not request.done.done()
        scheduler.set_paused(False)
        result = request.result()
    finally:
        scheduler.stop()
    ids = result.prompt_ids + result.output_ids[:-1]
    assert len(result.output_ids) == 12 and result.routed_experts.shape[0] == len(ids)
    alone, margin = alone_routing(moe_runner, ids)
    clear = margin > 1e-5
    assert (np.sort(result.routed_experts, -1) == alone).all(-1)[clear].all()


def test_the_answer_carries_the_record_compactly_and_the_rollout_reads_it(moe_runner):
    server = EngineServer(moe_runner, EngineConfig(engine_device="cpu"))
    body = {"input_ids": [[5, 6, 7], [8, 9, 10, 11, 12]], "return_logprob": True,
            "return_routed_experts": [True, False],
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    with TestClient(server.app) as client:
        answer = client.post("/generate", json=body)
        assert answer.status_code == 200, answer.text
        first, second = answer.json()
        bad = client.post("/generate", json={"input_ids": [5, 6], "return_routed_experts": "yes"})
    assert "routed_experts" not in second["meta_info"]
    meta = first["meta_info"]
    assert meta["routed_experts_dtype"] == "int8"
    assert meta["routed_experts_shape"] == [3 + 5 - 1, 2, 2]
    assert len(base64.b64decode(meta["routed_experts"])) == 7 * 2 * 2  # one byte per choice
    record = read_routed_experts(meta)
    assert record.shape == (7, 2, 2) and ((record >= 0) & (record < 4)).all()
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_routed_experts"


def test_a_dense_model_refuses_the_field(untrained_model):
    runner = ModelRunner(untrained_model, device="cpu")
    assert not runner.routing.is_moe
    with TestClient(EngineServer(runner, EngineConfig(engine_device="cpu")).app) as client:
        body = {"input_ids": [5, 6], "return_routed_experts": True}
        refused = client.post("/generate", json=body)
        plain = client.post("/generate", json={"input_ids": [5, 6], "return_routed_experts": False,
                                               "sampling_params": {"max_new_tokens": 2}})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "return_routed_experts" and "mixture-of-experts" in error["message"]
    assert plain.status_code == 200


def test_sglang_int32_answers_and_broken_ones():
    ids = np.arange(12, dtype=np.int32) % 4
    sglang = {"routed_experts": base64.b64encode(ids.tobytes()).decode()}  # no dtype, no shape
    assert read_routed_experts(sglang, fallback=(2, 2)).shape == (3, 2, 2)
    with pytest.raises(RoutedExpertsError, match="shape"):
        read_routed_experts(sglang)
    with pytest.raises(RoutedExpertsError, match="base64"):
        read_routed_experts({"routed_experts": "%%%", "routed_experts_dtype": "int8"})
    with pytest.raises(RoutedExpertsError, match="do not fill"):
        read_routed_experts({**sglang, "routed_experts_shape": [5, 2, 2]})
    assert read_routed_experts({}) is None
    names = [compact_dtype(e).name for e in (4, 128, 129, 40000)]
    assert names == ["int8", "int8", "int16", "int32"]


def test_the_rollout_asks_only_for_an_moe_policy(moe_dir, untrained_model):
    args = SimpleNamespace(record_routed_experts=True, hf_checkpoint=str(moe_dir))
    assert wanted_routing(args) == (2, 2)
    off = SimpleNamespace(record_routed_experts=False, hf_checkpoint=str(moe_dir))
    assert wanted_routing(off) is None
    assert wanted_routing(SimpleNamespace(record_routed_experts=True,
                                          hf_checkpoint=str(untrained_model))) is None


def test_a_router_of_another_shape_never_breaks_a_forward_and_is_named_when_asked():
    """A router that returns other than (logits, weights, indices): the hook keeps nothing (a
    request that did not ask is served as before); reading its choices names the router."""
    class PairRouter(torch.nn.Module):
        top_k = 2

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 3))

        def forward(self, x):
            return torch.topk(x @ self.weight.T, 2, dim=-1)  # (values, indices): a pair

    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.gate = PairRouter()
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    capture = RoutingCapture(model)
    assert capture.is_moe and capture.num_experts == 4
    layer.mlp.gate(torch.ones(5, 3))  # the forward goes through
    with pytest.raises(RuntimeError, match="return_routed_experts: this model's routers "
                                           r"\(PairRouter\) do not return expert"):
        capture.last(1)


def test_each_sample_of_a_group_gets_the_whole_record(moe_runner):
    """The samples of one prompt arrive together, their prefill runs the prompt once: every
    sample's record still covers its prompt and its own tokens as the routers choose them alone."""
    scheduler = Scheduler(moe_runner, EngineMetrics(model_name="t"), max_batch_size=8,
                          max_queued=64)
    ids = prompt(moe_runner, "what is 12+13? 12+13=")
    tracked = [Tracked(scheduler, f"s{i}", ids, params(6, seed=i)) for i in range(4)]
    for t in tracked:
        t.request.return_routed_experts = True
        t.submit()  # all queued before the scheduler starts: one prefill group
    scheduler.start()
    try:
        results = [t.result() for t in tracked]
    finally:
        scheduler.stop()
    assert len({tuple(r.output_ids) for r in results}) > 1  # the samples parted ways
    for i, r in enumerate(results):
        read = r.prompt_ids + r.output_ids[:-1]
        alone, margin = alone_routing(moe_runner, read)
        clear = margin > 1e-5
        assert r.routed_experts.shape[0] == len(read)
        assert (np.sort(r.routed_experts, -1) == alone).all(-1)[clear].all(), f"sample {i}"
