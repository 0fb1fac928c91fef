"""The training ranks' layout flags (--tensor-model-parallel-size, --pipeline-model-parallel-size,
--sequence-parallel): each refusal names its flag before anything starts; the batch rules split over
the data parallel ranks; the layout is in the run's params and in its checkpoints."""
import pytest

from miles import preflight
from miles.config import ConfigError, MilesConfig, TrainConfig, parse_config, redacted_flat_dict
from miles.config import parallel
from miles.config.parallel import RankLayout
from miles.run import checkpoint
from miles.tiny.model import tiny_shape

MEGATRON4 = ["--train-backend", "megatron", "--actor-num-gpus-per-node", "4"]


def refused(argv: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    return err.value


def test_defaults_are_one_replica_of_the_whole_model():
    config = parse_config([])
    t = config.train
    assert (t.tensor_model_parallel_size, t.pipeline_model_parallel_size) == (1, 1)
    assert not t.sequence_parallel
    assert parallel.rank_layout(t) == RankLayout(1, 1, 1) and config.data_parallel_size == 1


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"])
def test_sizes_below_one_are_refused(flag):
    assert refused([flag, "0"]).flag == flag


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"])
def test_fsdp_refuses_tensor_and_pipeline_parallel(flag):
    err = refused(["--actor-num-gpus-per-node", "2", flag, "2"])
    assert err.flag == flag
    assert "FSDP shards by data parallel only; use --train-backend megatron" in str(err)


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"])
def test_parallel_megatron_is_accepted(flag):
    config = parse_config([*MEGATRON4, flag, "2"])
    assert config.data_parallel_size == 2


def test_the_ranks_must_divide_by_tp_times_pp():
    err = refused(["--train-backend", "megatron", "--actor-num-gpus-per-node", "3",
                   "--tensor-model-parallel-size", "2"])
    assert err.flag == "--tensor-model-parallel-size" and "3 training ranks" in str(err)


def test_sequence_parallel_needs_tensor_parallel():
    err = refused(["--sequence-parallel"])
    assert err.flag == "--sequence-parallel" and "--tensor-model-parallel-size > 1" in str(err)
    assert refused([*MEGATRON4, "--sequence-parallel"]).flag == "--sequence-parallel"
    sp = parse_config([*MEGATRON4, "--tensor-model-parallel-size", "2", "--sequence-parallel"])
    assert sp.train.sequence_parallel
    fsdp = ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"]
    assert refused([*fsdp, "--sequence-parallel"]).flag == "--tensor-model-parallel-size"


def test_routing_replay_is_refused_with_sequence_parallel():
    err = refused([*MEGATRON4, "--tensor-model-parallel-size", "2", "--sequence-parallel",
                   "--use-rollout-routing-replay"])
    assert err.flag == "--use-rollout-routing-replay" and "--sequence-parallel" in str(err)


def test_batch_rules_split_over_data_parallel_ranks():
    batch = ["--rollout-batch-size", "3", "--n-samples-per-prompt", "2"]  # 6 samples per step
    assert refused([*MEGATRON4, *batch]).flag == "--global-batch-size"  # 6 over 4 replicas
    config = parse_config([*MEGATRON4, *batch, "--tensor-model-parallel-size", "2"])  # 6 over 2
    assert config.data_parallel_size == 2
    params = redacted_flat_dict(config)
    assert (params["tensor_model_parallel_size"], params["pipeline_model_parallel_size"],
            params["data_parallel_size"]) == (2, 1, 2)


@pytest.mark.parametrize("tp,pp,flag,fragment", [
    (3, 1, "--tensor-model-parallel-size", "attention heads (4)"),
    (4, 1, "--tensor-model-parallel-size", "KV heads (query groups) (2)"),
    (1, 4, "--pipeline-model-parallel-size", "2 layers"),
])
def test_the_model_must_divide_by_the_layout(monkeypatch, tp, pp, flag, fragment):
    # the tiny model: 4 heads, 2 KV heads, MLP 384, 2 layers
    monkeypatch.setattr(preflight, "_model_shape", lambda config: tiny_shape())
    train = TrainConfig(train_backend="megatron", actor_num_gpus_per_node=tp * pp,
                        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    with pytest.raises(ConfigError) as err:
        preflight.check_parallel_layout(MilesConfig(train=train))
    assert err.value.flag == flag and fragment in str(err.value)
    fits = TrainConfig(train_backend="megatron", actor_num_gpus_per_node=4,
                       tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    preflight.check_parallel_layout(MilesConfig(train=fits))


def test_checkpoints_record_the_layout_and_a_resume_names_both():
    old = checkpoint.TrainerState(rollout_id=3, weight_version=4, data_cursor={}, world_size=4)
    assert old.layout == RankLayout(1, 1, 4)  # before the layout was recorded: TP = PP = 1
    saved = checkpoint.TrainerState(3, 4, {}, 4, parallel={"tp": 2, "pp": 1, "dp": 2})
    assert checkpoint.layout_change(saved, RankLayout(2, 1, 2)) is None
    change = checkpoint.layout_change(saved, RankLayout(1, 2, 2))
    assert "TP=2 x PP=1 x DP=2" in change and "TP=1 x PP=2 x DP=2" in change


def test_the_layout_survives_a_sealed_checkpoint(tmp_path):
    state = checkpoint.TrainerState(1, 1, {}, 4, parallel={"tp": 2, "pp": 2, "dp": 1})
    sealed = checkpoint.seal(checkpoint.staging_dir(tmp_path, 1), tmp_path, state, keep=2)
    assert checkpoint.read_state(sealed).layout == RankLayout(2, 2, 1)


def test_an_fsdp_rank_refuses_a_parallel_layout_the_flags_did_not_check():
    from miles.backends.fsdp.actor import FSDPTrainActor

    train = TrainConfig(actor_num_gpus_per_node=2, tensor_model_parallel_size=2)  # not validated
    rank = FSDPTrainActor(MilesConfig(train=train), rank=0, world_size=2)
    with pytest.raises(ConfigError, match="FSDP shards by data parallel only"):
        rank._init_parallel()
