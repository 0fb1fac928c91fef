"""A dead or hung engine costs seconds, not rollouts (`python -m miles.train --use-fault-tolerance`), on real
engines, router and Ray: an engine SIGKILLed or SIGSTOPped as a rollout starts is relaunched on
its port and readmitted at the current weights; every rollout lands in the journal exactly once."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, parse_config
from miles.record.journal import read_journal
from miles.record.timeline import read_spans
from miles.run.faults import Fault, parse_fault, parse_faults
from tests.support.flags import SMALL

NUM_ROLLOUT = 3
# quick checks and relaunches, so a test spends its time on the fault, not on waiting for it
FAST = ["--use-fault-tolerance", "--engine-health-interval", "0.5", "--engine-health-timeout", "1",
        "--engine-hung-checks", "3", "--engine-restart-backoff", "0.2", "--engine-wait-timeout", "400"]


def test_inject_fault_names_the_engine_and_refuses_bad_specs():
    assert parse_fault("kill-engine@2") == Fault("kill-engine", 2, 0)
    assert parse_fault("stop-engine:1@0") == Fault("stop-engine", 0, 1)
    assert parse_fault("kill-engine:1@3").marker == "kill-engine:1@3"
    assert parse_fault("kill-router@1") == Fault("kill-router", 1, 0)
    assert parse_fault("abort-engine:1@2") == Fault("abort-engine", 2, 1)
    assert parse_fault("kill-engine:0@3").marker == "kill-engine@3"  # the marker of before engines had numbers
    for bad in ("raise:1@2", "stop-engine@x", "explode@1", "kill-engine:1", "kill-router:1@2",
                "abort-engine@"):
        with pytest.raises(ConfigError, match="--inject-fault"):
            parse_fault(bad)


def test_inject_fault_takes_a_list_one_fault_per_rollout():
    assert parse_faults(None) == () and parse_faults("") == ()
    assert parse_faults("kill@2") == (Fault("kill", 2, 0),)  # the single-value form
    assert parse_faults("kill-router@5, kill-engine:1@1,stop-engine:0@3") == (
        Fault("kill-engine", 1, 1), Fault("stop-engine", 3, 0), Fault("kill-router", 5, 0))
    with pytest.raises(ConfigError, match="--inject-fault.*both fire at rollout 2"):
        parse_faults("raise@2,kill-engine@2")
    with pytest.raises(ConfigError, match="--inject-fault.*explode@3"):
        parse_faults("raise@1,explode@3")
    with pytest.raises(ConfigError, match="--inject-fault: an empty fault"):
        parse_faults("raise@1,")


def test_the_fault_injector_fires_each_listed_fault_once_at_its_rollout(tmp_path):
    from miles.run.faults import FaultInjector, InjectedFault

    class Targets:
        def __init__(self):
            self.hits = []

        def kill_engine(self, index):
            self.hits.append(("kill-engine", index))
            return 1

        def stop_engine(self, index):
            self.hits.append(("stop-engine", index))
            return 2

        def kill_router(self):
            self.hits.append(("kill-router", 0))
            return 3

    targets = Targets()
    injector = FaultInjector("kill-engine:1@1,raise@2,kill-router@4", tmp_path, targets=targets)
    injector.before_iteration(0)
    injector.before_iteration(1)
    with pytest.raises(InjectedFault, match="raise@2"):
        injector.before_iteration(2)
    # the retried chunk starts again at rollout 1: the markers keep the fired faults from firing again
    for rollout_id in (1, 2, 3, 4, 4):
        injector.before_iteration(rollout_id)
    assert targets.hits == [("kill-engine", 1), ("kill-router", 0)]
    assert sorted(p.name for p in (tmp_path / "faults").iterdir()) == ["kill-engine:1@1", "kill-router@4", "raise@2"]


def test_fault_tolerance_needs_weights_on_disk():
    with pytest.raises(ConfigError, match="--use-fault-tolerance.*--colocate"):
        parse_config(["--use-fault-tolerance", "--colocate"])


def run_with_fault(run_dir, engines: int, fault: str, num_rollout: int = NUM_ROLLOUT):
    from miles.prepare import prepare_config
    from miles.train import train

    config = parse_config([*SMALL, "--num-rollout", str(num_rollout), "--eval-interval", "100",
                           "--rollout-num-engines", str(engines), "--inject-fault", fault, *FAST,
                           "--run-dir", str(run_dir)])
    summary = train(prepare_config(config))  # stops (SIGCONT, then terminate) every engine it started
    return summary, run_dir


def journal_lines(run_dir):
    return [ln for ln in read_journal(run_dir / "metrics.jsonl") if ln.rollout_id >= 0]


def engine_spans(run_dir, name: str):
    return [s for s in read_spans(run_dir / "timeline.jsonl") if s.lane == "engines" and s.name == name]


def assert_every_rollout_once(summary, run_dir, num_rollout: int, engines: int) -> None:
    # every rollout exactly once, none redone, the run finished, every engine serves the final weights
    assert [ln.rollout_id for ln in journal_lines(run_dir)] == list(range(num_rollout))
    assert summary.last_rollout_id == num_rollout - 1 and summary.resumed_at == 0
    assert summary.engine_versions == [str(num_rollout)] * engines


def assert_relaunched_once(run_dir, engine: int, num_rollout: int) -> None:
    restarts = [s for s in engine_spans(run_dir, "engine_restart") if s.args["engine"] == engine]
    assert len(restarts) == 1, restarts
    assert 0 <= restarts[0].args["weight_version"] <= num_rollout and restarts[0].end >= restarts[0].start


# One two-engine run fires three faults, each at its own rollout with a clean rollout between them, and the
# three tests below read it (before the fault list these were three runs of 3 rollouts).
TWO_ENGINES = 2
TWO_ENGINE_ROLLOUTS = 7
TWO_ENGINE_FAULTS = "kill-engine:1@1,stop-engine:0@3,kill-router@5"


@pytest.fixture(scope="module")
def two_engine_run(tmp_path_factory, ray_cluster):
    return run_with_fault(tmp_path_factory.mktemp("faults") / "run", TWO_ENGINES, TWO_ENGINE_FAULTS,
                          TWO_ENGINE_ROLLOUTS)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first to ask runs the three-fault run: the time of the three runs it replaces
def test_sigkill_of_one_of_two_engines_mid_rollout_costs_no_rollout(two_engine_run):
    summary, run_dir = two_engine_run
    assert_every_rollout_once(summary, run_dir, TWO_ENGINE_ROLLOUTS, TWO_ENGINES)
    assert_relaunched_once(run_dir, engine=1, num_rollout=TWO_ENGINE_ROLLOUTS)
    # the two engine faults relaunch the two engines, in order; a rollout's line counts the restarts that
    # finished during it (one may finish as the run stops: in the timeline, in no line)
    assert [s.args["engine"] for s in engine_spans(run_dir, "engine_restart")] == [1, 0]
    assert sum(ln.metrics["rollout/engine_restarts"] for ln in journal_lines(run_dir)) <= 2


@pytest.mark.slow
def test_sigkill_of_the_only_engine_waits_for_its_relaunch(tmp_path, ray_cluster):
    summary, run_dir = run_with_fault(tmp_path / "run", 1, "kill-engine@1")
    assert_every_rollout_once(summary, run_dir, NUM_ROLLOUT, 1)
    assert [s.args["engine"] for s in engine_spans(run_dir, "engine_restart")] == [0]
    assert_relaunched_once(run_dir, engine=0, num_rollout=NUM_ROLLOUT)
    assert sum(ln.metrics["rollout/engine_restarts"] for ln in journal_lines(run_dir)) <= 1


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first to ask runs the three-fault run: the time of the three runs it replaces
def test_a_sigstopped_engine_is_found_hung_killed_and_relaunched(two_engine_run):
    summary, run_dir = two_engine_run
    assert_every_rollout_once(summary, run_dir, TWO_ENGINE_ROLLOUTS, TWO_ENGINES)
    assert_relaunched_once(run_dir, engine=0, num_rollout=TWO_ENGINE_ROLLOUTS)
    reasons = [s.args["reason"] for s in engine_spans(run_dir, "engine_down") if s.args["engine"] == 0]
    assert len(reasons) == 1 and reasons[0].startswith("hung")
    # the SIGKILLed engine 1 was found dead, not hung
    killed = [s.args["reason"] for s in engine_spans(run_dir, "engine_down") if s.args["engine"] == 1]
    assert len(killed) == 1 and not killed[0].startswith("hung")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first to ask runs the three-fault run: the time of the three runs it replaces
def test_a_killed_router_comes_back_with_every_engine_and_costs_no_rollout(two_engine_run):
    summary, run_dir = two_engine_run
    assert_every_rollout_once(summary, run_dir, TWO_ENGINE_ROLLOUTS, TWO_ENGINES)
    assert sum(ln.metrics["rollout/router_restarts"] for ln in journal_lines(run_dir)) == 1
    spans = [s.name for s in read_spans(run_dir / "timeline.jsonl") if s.lane == "engines"]
    assert [name for name in spans if name.startswith("router_")] == ["router_down", "router_restart"]
    # the router's relaunch relaunched no engine: the only engine restarts are the two engine faults'
    assert len(engine_spans(run_dir, "engine_restart")) == 2
    # the relaunched router found every engine again: both serve the run's last weights at its end (an engine
    # still relaunching from the stop fault may come back after the router does: no order between them holds)
    assert len(summary.engine_versions) == 2 and len(set(summary.engine_versions)) == 1
