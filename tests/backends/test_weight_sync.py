"""WeightSync's two disk pushes (plain and supervised) share their steps: export to v<version>, keep only
that directory, tell the ranks the version. What each path does when an engine fails differs and is held
here: the plain push fails and keeps the old weights; the supervised one reports the engine and goes on."""
from __future__ import annotations

from pathlib import Path

import pytest

from miles.backends import sync
from miles.backends.sync import WeightSync

DEAD = "http://127.0.0.1:2"


class Ranks:
    """The ActorGroup calls a push makes: rank 0 writes the export directory; the version is recorded."""

    def __init__(self):
        self.version = None

    def call_bounded(self, method, directory, version, grace_s, gone, hung):
        assert method == "push_export" and grace_s > 0 and not gone(1) and not hung(1)
        Path(directory).mkdir(parents=True)
        return [None, None], [0.01, 0.02]

    def call(self, method, version):
        assert method == "set_weight_version"
        self.version = version


class Engines:
    """The engine side's weights module: a push to DEAD fails, every other one is recorded."""

    def __init__(self):
        self.loaded = []

    def push_weights_from_disk(self, url, model_dir, version, timeout=None, token=None):
        if url == DEAD:
            raise ConnectionError(f"{url} is down")
        self.loaded.append((url, Path(model_dir).name, version))


class Supervisor:
    def __init__(self, ready):
        self.ready, self.failed = ready, []

    def ready_urls(self):
        return list(self.ready)

    def engine_failed(self, url, why):
        self.failed.append(url)

    def attach_weights(self, weight_sync):
        pass


@pytest.fixture
def engines(monkeypatch):
    engines = Engines()
    monkeypatch.setattr(sync, "_engine_weights", lambda: engines)
    return engines


def exported(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("v*"))


def test_a_plain_push_loads_every_engine_then_keeps_only_the_new_weights(tmp_path, engines):
    (tmp_path / "v000001").mkdir()
    ranks = Ranks()
    WeightSync(ranks, ["http://127.0.0.1:1"], None, tmp_path, in_memory=False).push(2)
    assert engines.loaded == [("http://127.0.0.1:1", "v000002", "2")]
    assert exported(tmp_path) == ["v000002"] and ranks.version == 2


def test_a_failed_plain_push_keeps_the_old_weights_and_version(tmp_path, engines):
    (tmp_path / "v000001").mkdir()
    ranks = Ranks()
    with pytest.raises(ConnectionError):
        WeightSync(ranks, ["http://127.0.0.1:1", DEAD], None, tmp_path, in_memory=False).push(2)
    assert exported(tmp_path) == ["v000001", "v000002"] and ranks.version is None


def test_a_supervised_push_reports_the_failed_engine_and_moves_on(tmp_path, engines):
    (tmp_path / "v000001").mkdir()
    ranks, supervisor = Ranks(), Supervisor(["http://127.0.0.1:1", DEAD])
    weight_sync = WeightSync(ranks, ["http://127.0.0.1:1", DEAD], None, tmp_path, in_memory=False,
                             supervisor=supervisor)
    weight_sync.push(2)
    assert supervisor.failed == [DEAD] and engines.loaded == [("http://127.0.0.1:1", "v000002", "2")]
    assert exported(tmp_path) == ["v000002"] and ranks.version == 2
    assert weight_sync.current() == (tmp_path / "v000002", 2)


def test_the_transfer_flags_validate_naming_the_flag():
    from miles.config import parse_config
    from miles.config.fields import ConfigError

    base = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4"]
    config = parse_config(base)
    assert config.train.update_weight_transfer_mode == "disk"  # the default until broadcast is proven in runs
    assert config.train.update_weight_buffer_size == 512 * 2**20  # Miles' default
    assert parse_config(base + ["--update-weight-buffer-size", "1024"]).train.update_weight_buffer_size == 1024
    refused = {("--update-weight-buffer-size", "0"): ">= 1",
               ("--update-weight-transfer-mode", "p2p"): "disk, broadcast",
               ("--update-weight-transfer-mode", "broadcast", "--colocate"): "--colocate",
               ("--update-weight-transfer-mode", "broadcast", "--engine", "sglang"): "NCCL"}
    # with supervision a broadcast push also writes the directory relaunched engines load
    assert parse_config(base + ["--update-weight-transfer-mode", "broadcast",
                                "--use-fault-tolerance"]).orchestration.use_fault_tolerance
    for argv, why in refused.items():
        with pytest.raises(ConfigError, match=why) as caught:
            parse_config(base + list(argv))
        assert caught.value.flag == argv[0], argv


def test_a_config_less_group_pushes_through_disk(tmp_path):
    assert WeightSync(Ranks(), ["http://127.0.0.1:1"], None, tmp_path, in_memory=False).transfer_mode == "disk"


def test_an_engine_that_times_out_a_disk_push_is_named(tmp_path, monkeypatch):
    """A load that outlasts --update-weight-timeout (httpx's timeout) fails naming the engine."""
    import httpx

    class Silent:
        @staticmethod
        def push_weights_from_disk(url, model_dir, version, timeout=None, token=None):
            raise httpx.ReadTimeout("timed out")

    monkeypatch.setattr(sync, "_engine_weights", lambda: Silent)
    failures, _ = sync.push_disk_each([DEAD], tmp_path, 3, timeout_s=7)
    assert "engine http://127.0.0.1:2 did not load weight version 3" in str(failures[DEAD])
    assert "--update-weight-timeout 7 s" in str(failures[DEAD])


def test_an_engine_that_refuses_the_connection_is_not_blamed_on_the_deadline(tmp_path, monkeypatch):
    """A refused connection fails at once: the message says so, not that a deadline of minutes passed
    in 0.0 s (a killed engine's push read 'did not load ... within 0.0 s (deadline ...)')."""
    import httpx

    class Refusing:
        @staticmethod
        def push_weights_from_disk(url, model_dir, version, timeout=None, token=None):
            raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(sync, "_engine_weights", lambda: Refusing)
    failures, _ = sync.push_disk_each([DEAD], tmp_path, 3, timeout_s=7)
    message = str(failures[DEAD])
    assert "engine http://127.0.0.1:2 could not be reached to load weight version 3" in message
    assert "deadline" not in message


@pytest.mark.parametrize("error, ends_ranks", [("its process died (SIGKILL)", True),
                                               ("WeightBroadcastError: weight update group "
                                                "'miles-pp_1', bucket 2 of 4: engine URL never "
                                                "answered", False)])
def test_a_broadcast_send_that_loses_a_rank_ends_the_ranks(tmp_path, error, ends_ranks):
    """A source rank that dies (or stops) mid-send is the ranks' failure: they are ended, as for a
    failed gather (the relaunch path); an engine's failure leaves them in step and is reported."""
    from miles.backends.group import RankCallError
    from miles.backends.weight_broadcast import SendTarget

    class Sending(Ranks):
        killed = False

        def call_bounded(self, method, *args, grace_s, gone, hung):
            raise RankCallError(method, {1: error}, [])

        def kill(self):
            self.killed = True

    ranks = Sending()
    weight_sync = WeightSync(ranks, ["http://127.0.0.1:1"], None, tmp_path, in_memory=False)
    target = SendTarget(("http://127.0.0.1:1",), None)
    if ends_ranks:
        with pytest.raises(sync.RanksFailedError, match="rank 1: its process died"):
            weight_sync._send_on_ranks(target, 3)
    else:
        assert weight_sync._send_on_ranks(target, 3) == ([], f"rank 1: {error}")
    assert ranks.killed == ends_ranks
