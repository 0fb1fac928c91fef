"""Rollout routing replay (R3) end to end on the tiny MoE policy, in process: the embedded engine's
scheduler serves it in bfloat16 (`--engine-dtype`, as SGLang serves a model in its checkpoint's
bf16) and records each token's experts (read back through the wire encoding); an FSDP or a
Megatron rank scores and trains the same weights in float32, so its own routers choose otherwise
where two experts' probabilities are closer than bf16 can tell apart, as in a real run. The policy
is tests/support/moe.py's (a near-uniform router, experts that differ).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from miles.backends.batch import micro_batches
from miles.backends.pack import split_for_ranks
from miles.config import parse_config
from miles.moe.replay import METRIC
from miles.rollout.sample import Sample
from tests.support.moe import engine_rollout, moe_checkpoint

PROMPTS = ["12+13=", "1+2=", "99+1=", "7+8="]
PER_PROMPT = 4
SAMPLES = len(PROMPTS) * PER_PROMPT
ENGINE_DTYPE = "bfloat16"
DIFF = "train/train_rollout_logprob_abs_diff"


def config(replay: bool, backend: str):
    argv = ["--rollout-batch-size", str(len(PROMPTS)), "--n-samples-per-prompt", str(PER_PROMPT),
            "--micro-batch-size", "8", "--num-steps-per-rollout", "1", "--train-backend", backend]
    return parse_config(argv + (["--use-rollout-routing-replay"] if replay else []))


class ExpertsUsed:
    """The experts each MoE layer of a rank's model computes every token with, call by call, as
    sorted (tokens, k) indices in the HF token order (batch-major): what transformers' `mlp.experts`
    is handed, or the routing map megatron-core's router hands its token dispatcher."""

    def __init__(self, actor, backend: str):
        self.calls: list[tuple[int, torch.Tensor]] = []
        if backend == "fsdp":
            modules = [layer.mlp.experts for layer in actor.model.model.layers]
            self.handles = [m.register_forward_hook(self._keep_hf(i))
                            for i, m in enumerate(modules)]
        else:
            routers = actor.replays[id(actor.model)].routers  # global layer -> TopKRouter
            self.handles = [r.register_forward_hook(self._keep_megatron(i))
                            for i, r in routers.items()]

    def _keep_hf(self, layer):
        def keep(module, inputs, output):  # inputs: (hidden, top_k_index, top_k_weights)
            self.calls.append((layer, inputs[1].detach().sort(-1).values))
        return keep

    def _keep_megatron(self, layer):
        def keep(module, inputs, output):  # inputs[0] (T, B, H); output (probs, routing_map)
            t, b = inputs[0].shape[:2]
            k = int(output[1][0].sum())
            chosen = output[1].float().topk(k, dim=-1).indices.sort(-1).values
            self.calls.append((layer, chosen.reshape(t, b, k).transpose(0, 1).reshape(t * b, k)))
        return keep

    def remove(self):
        for h in self.handles:
            h.remove()


def rank(backend: str, model_dir: Path):
    if backend == "fsdp":
        from miles.backends.fsdp.actor import FSDPTrainActor as Rank
    else:
        from miles.backends.megatron.actor import MegatronTrainActor as Rank
    actor = Rank(config(False, backend), 0, 1)
    actor.init(str(model_dir), "127.0.0.1", actor.open_store("127.0.0.1"))
    return actor


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    engine_weights = moe_checkpoint(tmp_path_factory.mktemp("r3") / "engine")
    samples = engine_rollout(engine_weights, PROMPTS, PER_PROMPT, ENGINE_DTYPE)
    advantages = [float(a) for a in np.random.default_rng(0).standard_normal(SAMPLES)]
    batch = split_for_ranks(samples, advantages, SAMPLES, 1, rollout_id=0)[0]
    return engine_weights, samples, batch


@pytest.fixture(scope="module", params=["fsdp", "megatron"])
def r3(request, rollout):
    """One rank of the backend, in this process, trained on the rollout with and without replay."""
    backend, (engine_weights, samples, batch) = request.param, rollout
    threads = torch.get_num_threads()
    actor = rank(backend, engine_weights)
    try:
        results, used = {}, {}
        for replay in (False, True):
            actor.config = config(replay, backend)
            actor.load_base(str(engine_weights))  # both passes start from the engine's weights
            seen = ExpertsUsed(actor, backend)
            results[replay] = actor.train(batch)
            seen.remove()
            used[replay] = seen.calls
        yield dict(samples=samples, batch=batch, results=results, used=used, trainer=engine_weights,
                   pad_id=actor.pad_id)
    finally:
        actor.shutdown()
        torch.set_num_threads(threads)


def own_mismatch(trainer_dir: Path, samples: list[Sample]) -> tuple[float, int]:
    """Recounted apart from the trainer: the trainer's weights in a plain HF model, each sample
    alone; the mean over samples of the share of response (token, layer) routings whose expert set
    differs from the engine's, and how many layer-0 routings differ (those do not depend on
    replay)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trainer_dir, dtype=torch.float32).eval()
    chosen: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: chosen.append(o[2]))
             for layer in model.model.layers]
    shares, layer0 = [], 0
    for s in samples:
        chosen.clear()
        with torch.no_grad():
            model(input_ids=torch.tensor([s.tokens]))
        own = torch.stack(chosen, dim=1).sort(-1).values.numpy()  # (tokens, layers, k)
        engine = np.sort(s.routed_experts.astype(np.int64), axis=-1)
        start = len(s.tokens) - s.response_length - 1  # the positions that predict the response
        differs = (own[start:len(s.tokens) - 1] != engine[start:]).any(-1)  # (response, layers)
        shares.append(differs.mean())
        layer0 += int(differs[:, 0].sum())
    for h in hooks:
        h.remove()
    return float(np.mean(shares)), layer0


def engine_records(r3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(record, recorded) per expected experts call, in call order: the log-prob pass then the
    training pass, each micro-batch, each layer; record (B*T, k) sorted, recorded (B*T,) where the
    engine read a token."""
    mbs = micro_batches(r3["batch"], 8, r3["pad_id"], torch.device("cpu"))
    out = []
    for mb in mbs + mbs:
        for layer in range(mb.routed_experts.shape[2]):
            record = mb.routed_experts[:, :, layer].reshape(-1, mb.routed_experts.shape[-1]).long()
            record = record.sort(-1).values  # the engine's set: -1 stays first where it has none
            out.append((record, (record >= 0).all(-1)))
    return out


def test_with_replay_every_recorded_token_goes_to_the_engines_experts(r3):
    expected = engine_records(r3)
    calls = r3["used"][True]
    assert len(calls) == len(expected)
    passes_x_layers = 2 * 2
    read = sum(len(s.tokens) - 1 for s in r3["samples"])  # the engine read all but the last token
    assert sum(int(known.sum()) for _, known in expected) == passes_x_layers * read
    for n, ((layer, indices), (record, known)) in enumerate(zip(calls, expected)):
        assert torch.equal(indices[known], record[known]), f"call {n}: layer {layer} strays"
    # without replay the trainer's own choice differs on some tokens: the check above can fail
    strays = sum(int((indices[known] != record[known]).any(-1).sum())
                 for (_, indices), (record, known) in zip(r3["used"][False], expected))
    assert strays > 0


def test_the_mismatch_fraction_counts_the_trainers_own_choices_with_and_without_replay(r3):
    expected, layer0 = own_mismatch(r3["trainer"], r3["samples"])
    assert expected > 0, "the fp32 trainer chose as the bf16 engine everywhere: nothing to replay"
    without = r3["results"][False].sums[METRIC] / SAMPLES
    assert without == pytest.approx(expected, abs=1e-6)
    # with replay it is still the trainer's own choice: layer 0 sees the same inputs either way, and
    # a later layer too while no earlier layer was replayed otherwise
    with_replay = r3["results"][True].sums[METRIC] / SAMPLES
    assert with_replay > 0
    if layer0 == 0:
        assert with_replay == pytest.approx(without, abs=1e-6)


def test_replay_brings_the_trainers_log_probs_closer_to_the_engines(r3):
    without = r3["results"][False].sums[DIFF] / SAMPLES
    with_replay = r3["results"][True].sums[DIFF] / SAMPLES
    assert with_replay < without
