"""Megatron-core's tensor and pipeline parallel ranks on gloo (CPU): the same batch and seed give
TP=2, PP=2, TP=2 x PP=2, TP=2 x DP=2 and TP=2 with sequence parallel (odd sequence lengths padded
to a multiple of TP, the norms' partial gradients summed over TP) the step TP = PP = 1 takes
(loss, per-token log-probs, grad norm; weights after three optimizer steps), through
megatron-core's own parallel layers and 1F1B schedule. Also: the vocab-parallel log-prob and
entropy math against the full-logit one, and the CPU shim staying out of the way when CUDA is
present."""
import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from miles.backends.logprobs import stats_from_logits
from miles.backends.megatron import replica_batch, shim
from miles.backends.megatron.vocab_parallel import stats_from_vocab_shard
from miles.backends import pack
from miles.backends.pack import combine, split_for_ranks
from tests.support.actors import LOSS, config, max_abs_diff, rollout_like, weights
from tests.support.groups import KeptGroups

STEPS = 3


# ---- the vocab-parallel math --------------------------------------------------------------------
def _full_logits(vocab: int):
    torch.manual_seed(0)
    logits = torch.randn(3, 7, vocab) * 3
    ids = torch.randint(0, vocab, (3, 7))
    return logits, ids


def _grads_full(logits, ids, temperature):
    full = logits.clone().requires_grad_(True)
    stats = stats_from_logits(full, ids, temperature)
    (stats.log_probs.sum() + 0.3 * stats.entropy.sum()).backward()
    return stats, full.grad


def _vocab_rank(rank: int, world: int, port: int, vocab: int, padded: int, queue) -> None:
    """One TP rank: its slice of the padded logits; returns its stats and its slice's gradient."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        logits, ids = _full_logits(vocab)
        pad = torch.full((*logits.shape[:2], padded - vocab), 5.0)  # large: they must not count
        local = padded // world
        shard = torch.cat([logits, pad], -1)[..., rank * local:(rank + 1) * local].clone()
        shard.requires_grad_(True)
        stats = stats_from_vocab_shard(shard, ids, 0.7, rank * local, vocab, dist.group.WORLD)
        (stats.log_probs.sum() + 0.3 * stats.entropy.sum()).backward()
        # numpy arrays travel by value: a tensor's shared memory is gone once this process exits
        queue.put((rank, stats.log_probs.detach().numpy(), stats.entropy.detach().numpy(),
                   shard.grad.numpy()))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vocab_parallel_stats_equal_the_full_logits():
    vocab, padded = 37, 40  # two ranks of 20 columns; the last 3 are padding
    logits, ids = _full_logits(vocab)
    full, grad = _grads_full(logits, ids, 0.7)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_vocab_rank, args=(r, 2, port, vocab, padded, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    answers = [queue.get(timeout=120) for _ in procs]
    results = {r: [torch.from_numpy(a) for a in rest] for r, *rest in answers}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, (log_probs, entropy, shard_grad) in results.items():
        torch.testing.assert_close(log_probs, full.log_probs.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(entropy, full.entropy.detach(), rtol=0, atol=1e-5)
        columns = range(rank * 20, min((rank + 1) * 20, vocab))
        torch.testing.assert_close(shard_grad[..., :len(columns)],
                                   grad[..., columns.start:columns.stop], rtol=0, atol=1e-5)
        assert not shard_grad[..., len(columns):].any()  # the pad columns take no gradient
    # one rank holding the whole (padded) vocabulary: the same numbers
    padded_logits = torch.cat([logits, torch.zeros(3, 7, 3)], -1)
    single = stats_from_vocab_shard(padded_logits, ids, 0.7, 0, vocab)
    torch.testing.assert_close(single.log_probs, full.log_probs.detach(), rtol=0, atol=1e-5)


# ---- one replica's batch ------------------------------------------------------------------------
def test_a_replica_pools_its_members_slices_step_by_step():
    samples, advantages = rollout_like()
    whole = split_for_ranks(samples, advantages, 8, 1, rollout_id=0)[0]  # 2 steps of 8
    two = split_for_ranks(samples, advantages, 8, 2, rollout_id=0)  # each: 2 steps of 4
    pooled = replica_batch.merge(two)
    assert pooled == whole  # member 0's step-0 rows, member 1's, then step 1's: one rank's order
    assert replica_batch.merge([whole, whole]) == whole  # split by replica: not doubled
    replicas = split_for_ranks(samples, advantages, 8, 2, rollout_id=0)
    # 8 ranks at TP=2 x PP=2 x DP=2: replica 0 is ranks 0, 1, 4, 5
    handed = pack.split_for_replicas(samples, advantages, 8, 2, 2, 2, rollout_id=0)
    assert [replicas.index(b) for b in handed] == [0, 0, 1, 1, 0, 0, 1, 1]


# ---- the shim -----------------------------------------------------------------------------------
def test_the_shim_changes_nothing_when_cuda_is_present(monkeypatch):
    from megatron.core.fusions import fused_softmax

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(shim, "_installed", False)
    def patched():
        cuda = torch.cuda
        return cuda.current_device, cuda.synchronize, fused_softmax.get_default_causal_mask

    before = patched()
    assert not shim.needed()
    shim.install()
    assert patched() == before
    assert not shim._installed
    assert isinstance(shim.cuda_to_cpu(), contextlib.nullcontext)


def test_the_shim_maps_cuda_to_the_cpu_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the shim is not used")
    with shim.cuda_to_cpu():
        made = torch.zeros(2, device="cuda")
        assert made.device.type == "cpu" and made.cuda() is made


# ---- the parallel step against TP = PP = 1 ------------------------------------------------------
def parallel_config(world: int, tp: int = 1, pp: int = 1, sp: bool = False):
    """One optimizer step per call (16 samples, micro-batches of 2), the whole loss (KL,
    entropy)."""
    return config(world, train_backend="megatron", num_steps_per_rollout=1,
                  tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                  sequence_parallel=str(sp).lower(), **LOSS)


def train_steps(group, cfg) -> list:
    """STEPS calls of one optimizer step each, on the same rollouts for every layout."""
    summaries = []
    for seed in range(STEPS):
        samples, advantages = rollout_like(seed=seed)
        batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size,
                                  rollout_id=seed, return_token_stats=True)
        summaries.append(combine(group.train(batches)))
    return summaries


def run_layout(groups, world: int, tp: int, pp: int, sp: bool = False):
    cfg = parallel_config(world, tp, pp, sp)
    with groups.started(cfg) as group:
        places = [info.extra["parallel"] for info in group.call("info")]
        # each rank's replica, as megatron-core assigned it, is the one a trainer can compute
        assert [p["dp_rank"] for p in places] == \
            [pack.replica_of_rank(r, tp, pp, world) for r in range(world)]
        return train_steps(group, cfg), weights(group)


@pytest.fixture(scope="module")
def groups(ray_cluster, base_model):
    """TP=2 and PP=2 (2 ranks each) serve both the checkpoint test and the layout comparison: each
    started once, reset to the base weights for its second test and stopped after it
    (tests/support/groups.py; the checkpoint test comes first, so that at most 5 ranks are up at
    once, against 4 with a group per test); the other layouts' groups stop when their test ends."""
    kept = KeptGroups(base_model, [(parallel_config(2, tp=2), 2), (parallel_config(2, pp=2), 2)])
    yield kept
    kept.stop_all()


@pytest.fixture(scope="module")
def single(groups):
    return run_layout(groups, 1, 1, 1)


# ---- checkpoints --------------------------------------------------------------------------------
def one_step(group, cfg, seed: int):
    samples, advantages = rollout_like(seed=seed)
    batches = split_for_ranks(samples, advantages, cfg.global_batch_size, cfg.world_size,
                              rollout_id=seed)
    return combine(group.train(batches))


def test_a_checkpoint_resumes_bit_exact_and_on_another_layout(groups, tmp_path):
    """HF-named weights and optimizer state whatever the layout: TP=2 resumes its own checkpoint bit
    for bit, and PP=2 resumes it too (its shards and moments cut anew), taking the same next
    step. (Each group, from the base weights, then serves its layout's comparison below.)"""
    tp_cfg, pp_cfg = parallel_config(2, tp=2), parallel_config(2, pp=2)
    with groups.started(tp_cfg) as tp:
        one_step(tp, tp_cfg, seed=0)  # the optimizer's moments are not zero
        files = tp.call("save", str(tmp_path))
        assert "optimizer.pt" in files[0] and files[1] == ["rng_rank1.pt"]
        optim = torch.load(tmp_path / "optimizer.pt", weights_only=True)
        assert "model.layers.0.self_attn.q_proj.weight" in optim["state"]  # HF names, whole tensors
        saved = tp.call("weights_digest")
        after_save = one_step(tp, tp_cfg, seed=1)
        tp.call("load", str(tmp_path))
        assert tp.call("weights_digest") == saved
        again = one_step(tp, tp_cfg, seed=1)
        assert again.metrics == after_save.metrics  # bit for bit
        after_weights = weights(tp)
    with groups.started(pp_cfg) as pp:
        pp.call("load", str(tmp_path))
        assert pp.call("weights_digest") == saved
        other = one_step(pp, pp_cfg, seed=1)
        for key, value in after_save.metrics.items():
            assert other.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
        assert max_abs_diff(weights(pp), after_weights) <= 1e-4  # layouts round differently (Adam)


# ---- every layout against TP = PP = 1 ---------------------------------------------------------
@pytest.mark.parametrize("world,tp,pp,sp", [(2, 2, 1, False), (2, 1, 2, False), (4, 2, 2, False),
                                           (4, 2, 1, False), (2, 2, 1, True)],
                         ids=["tp2", "pp2", "tp2xpp2", "tp2xdp2", "tp2-sequence-parallel"])
def test_parallel_layouts_take_the_single_rank_step(single, groups, world, tp, pp, sp):
    (ref, ref_weights), (got, got_weights) = single, run_layout(groups, world, tp, pp, sp)
    first, mine = ref[0], got[0]
    assert mine.metrics["train/loss"] == pytest.approx(first.metrics["train/loss"], rel=0, abs=1e-5)
    assert mine.token_stats.keys() == first.token_stats.keys() and len(first.token_stats) == 16
    for index, stats in first.token_stats.items():
        for key in ("log_probs", "entropy"):
            per_token = mine.token_stats[index][key]
            assert per_token == pytest.approx(stats[key], rel=0, abs=1e-5), (index, key)
    for a, b in zip(ref, got):  # every step: the same grad norm, metrics, parameter norm
        assert b.metrics["train/grad_norm"] == pytest.approx(a.metrics["train/grad_norm"], rel=1e-5)
        norm = a.metrics["train/param_norm"]
        assert b.metrics["train/param_norm"] == pytest.approx(norm, rel=1e-6)
        for key, value in a.metrics.items():
            assert b.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert max_abs_diff(ref_weights, got_weights) <= 1e-4  # after STEPS optimizer steps (HF names)
