"""Megatron-core ranks on a Llama-architecture checkpoint (SmolLM2's layout: no q/k norms, tied embeddings):
exact HF <-> Megatron conversion, HF-equal log-probs, and the same optimizer step as the FSDP ranks.
A small random Llama stands in for SmolLM2 here; tests/training/test_smollm2.py runs the real one."""
import pytest
import ray
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from miles.backends.batch import micro_batches
from miles.backends.group import ActorGroup
from miles.backends.megatron import convert
from miles.backends.megatron.model import check_supported
from miles.backends.pack import split_for_ranks
from tests.support.actors import fsdp, max_abs_diff, megatron, rollout_like, step, weights


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=True, rope_theta=100000.0, pad_token_id=2, eos_token_id=2)
    model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("llama")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llama_groups(ray_cluster, llama_dir):
    made = {"megatron": ActorGroup(megatron(1), str(llama_dir)), "fsdp": ActorGroup(fsdp(1), str(llama_dir))}
    yield made
    for group in made.values():
        group.stop()


def test_llama_round_trip_is_exact_without_qk_norms(llama_dir):
    hf = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32)
    lay = convert.Layout.of(hf.config)
    assert (lay.qk_norm, lay.tied) == (False, True)
    state = hf.state_dict()
    mg = convert.hf_to_megatron(state, lay)
    assert not any("layernorm" in k and ("q_" in k or "k_" in k) for k in mg)
    back = convert.megatron_to_hf(mg, lay)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    for name in state:
        assert convert.megatron_source(name, lay) in mg


def test_other_architectures_are_refused_by_name():
    config = AutoConfig.for_model("mistral", vocab_size=32, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="converts llama, qwen3 and qwen3_moe checkpoints; this one is 'mistral'"):
        check_supported(config)


def test_llama_log_probs_and_step_equal_hf_and_fsdp(llama_groups, llama_dir):
    def compare_with_hf(actor, micro_batches_, model_path):
        from miles.backends.fsdp.logprobs import token_stats

        hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        base, ours = hf.state_dict(), actor.hf_state()
        exact = ours.keys() == base.keys() and all(torch.equal(ours[k], base[k]) for k in base)
        diff = 0.0
        actor.model.eval()
        with torch.no_grad():
            for mb in micro_batches_:
                real = mb.attention_mask[:, 1:].bool()
                mine = actor.token_stats(actor.model, mb)
                theirs = token_stats(hf, mb.input_ids, mb.attention_mask, actor.config.rollout.rollout_temperature)
                diff = max(diff, (mine.log_probs - theirs.log_probs)[real].abs().max().item())
        return {"exact": exact, "log_probs": diff}

    meg, fs = llama_groups["megatron"], llama_groups["fsdp"]
    samples, advantages = rollout_like()
    (batch,) = split_for_ranks(samples, advantages, 16, 1, rollout_id=0)
    mbs = micro_batches(batch, 4, 0, torch.device("cpu"))
    result = ray.get(meg.actors[0].__ray_call__.remote(compare_with_hf, mbs, str(llama_dir)))
    assert result["exact"] and result["log_probs"] <= 1e-4, result
    assert meg.call("weights_digest") == fs.call("weights_digest")
    cfg = megatron(1)
    step(meg, cfg, samples, advantages)
    step(fs, fsdp(1), samples, advantages)
    assert max_abs_diff(weights(meg), weights(fs)) <= 1e-5
