"""How a plain run starts (`miles.train`'s driver): the training ranks load the model while the engines start,
the trainer waits for them, and ranks launched for a run that fails before its trainer took them are ended.
The order with stand-ins for the parts (what the driver does, not what the parts do); the real ranks' launch
without waiting on real Ray."""
from __future__ import annotations

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config


class Stop(Exception):
    """Raised by a stand-in where the test has seen enough."""


@pytest.fixture
def driver(monkeypatch, tmp_path, base_model):
    """`_train_services` with stand-ins for Ray, the ranks, the engines and the trainer; `events` is their log."""
    import ray

    import miles.backends.group
    import miles.cluster.connect
    import miles.cluster.local
    import miles.trainer
    from miles.train import _train_services

    events: list[str] = []

    class Group:
        def __init__(self, config, model_path, names=None, wait=True):
            events.append(f"ranks launched, wait={wait}")

        def kill(self):
            events.append("ranks killed")

    class Services:
        rollout_url, engine_urls = "http://127.0.0.1:1", ["http://127.0.0.1:2"]

        def stop(self):
            events.append("engines stopped")

    def start_inference(config, use_router=True):
        events.append("engines started")
        if driver.engines_fail:
            raise RuntimeError("an engine did not start")
        return Services()

    class Trainer:
        @classmethod
        def start(cls, config, rollout_url, engine_urls, names=None, supervisor=None, group=None):
            events.append(f"trainer given {type(group).__name__}")
            raise Stop

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray is started
    monkeypatch.setattr(miles.backends.group, "ActorGroup", Group)
    monkeypatch.setattr(miles.cluster.local, "start_inference", start_inference)
    monkeypatch.setattr(miles.trainer.RLTrainer, "start", Trainer.start)

    def driver(*flags):
        config = prepare_config(parse_config(["--run-dir", str(tmp_path / "run"), *flags]))
        _train_services(config, True, ())
    driver.events, driver.engines_fail = events, False
    return driver


def test_the_ranks_are_launched_before_the_engines_start_and_handed_to_the_trainer(driver):
    with pytest.raises(Stop):
        driver()
    assert driver.events[:3] == ["ranks launched, wait=False", "engines started", "trainer given Group"]


def test_colocated_ranks_settle_before_an_engine_sizes_its_memory(driver):
    with pytest.raises(Stop):
        driver("--colocate")
    assert driver.events[:2] == ["ranks launched, wait=True", "engines started"]


def test_ranks_of_a_run_whose_engines_did_not_start_are_ended(driver):
    driver.engines_fail = True
    with pytest.raises(RuntimeError, match="an engine did not start"):
        driver()
    assert driver.events == ["ranks launched, wait=False", "engines started", "ranks killed"]


@pytest.mark.slow
def test_real_ranks_launched_without_waiting_load_in_the_background(base_model, tmp_path, ray_cluster):
    """`ActorGroup(wait=False)` returns before the ranks have loaded the model (a Ray worker starts and imports
    torch first: seconds); `wait_started` returns once they have, and the ranks then answer."""
    import ray

    from miles.backends.group import ActorGroup

    config = prepare_config(parse_config(["--run-dir", str(tmp_path / "run"), "--actor-num-gpus-per-node", "2"]))
    group = ActorGroup(config, str(base_model), wait=False)
    try:
        ready, loading = ray.wait(group._starting, num_returns=2, timeout=0)
        assert ready == [] and len(loading) == 2  # the launch did not wait for either rank
        group.wait_started()
        assert group._starting == []
        assert [info.rank for info in group.call("info")] == [0, 1]
        assert all(info.optimizer_steps == 0 for info in group.call("info"))
    finally:
        group.stop()
