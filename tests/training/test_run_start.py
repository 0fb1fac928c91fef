"""How a plain run starts (`miles.train`'s driver): the training ranks load the model while the engines start,
the trainer waits for them, and ranks launched for a run that fails before its trainer took them are ended.
The order with stand-ins for the parts (what the driver does, not what the parts do); the real ranks' launch
without waiting on real Ray."""
from __future__ import annotations

import dataclasses

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config


class Stop(Exception):
    """Raised by a stand-in where the test has seen enough."""


@pytest.fixture
def driver(monkeypatch, tmp_path, base_model):
    """`train` with stand-ins for Ray, ranks, engines and trainer; `events` is their log."""
    import ray

    import miles.backends.group
    import miles.cluster.local
    import miles.trainer
    from miles.train import train

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
        train(config)
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


@pytest.mark.parametrize("engine,launches", [
    ("embedded", ["launch 0, wait=False", "launch 1, wait=False", "ready 0", "ready 1"]),
    ("sglang", ["launch 0, wait=True", "ready 0", "launch 1, wait=True", "ready 1"]),
])
def test_embedded_engines_start_together_and_sglang_engines_one_after_another(engine, launches, monkeypatch,
                                                                               tmp_path, base_model):
    """Two SGLang engines see the same GPUs, and each sizes its memory pool by what is free when it starts."""
    import miles.engines.launch
    from miles.cluster.local import start_inference

    events: list[str] = []

    class Handle:
        def __init__(self, i, wait):
            self.i, self.url = i, f"http://127.0.0.1:{1000 + i}"
            events.append(f"launch {i}, wait={wait}")
            if wait:
                self.wait_ready(1.0)

        def wait_ready(self, timeout):
            if f"ready {self.i}" not in events:
                events.append(f"ready {self.i}")
            return self

    def launch_engine(model_dir, config, *, log_path, wait=True, **kwargs):
        return Handle(int(log_path.stem.rsplit("-", 1)[1]), wait)

    monkeypatch.setattr(miles.engines.launch, "launch_engine", launch_engine)
    config = prepare_config(parse_config(["--run-dir", str(tmp_path / "run"), "--rollout-num-engines", "2"]))
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, engine=engine))  # nothing starts
    services = start_inference(config, use_router=False)
    assert events == launches
    assert services.engine_urls == ["http://127.0.0.1:1000", "http://127.0.0.1:1001"]


def test_a_service_started_without_waiting_that_exits_raises_with_its_log(tmp_path):
    from miles.serving.process import ServiceStartError, free_port, start_service

    service = start_service(["python3", "-c", "print('no model here'); raise SystemExit(3)"], "127.0.0.1",
                            free_port(), tmp_path / "svc.log", health_path="/health", timeout=30, wait=False)
    with pytest.raises(ServiceStartError, match=r"(?s)exited with code 3.*no model here"):
        service.wait_ready(30)
