"""`miles train` parses its flags once: the flow it runs in its own process takes the config `main` prepared,
and the flow run's name is read off the flags without parsing them."""
from __future__ import annotations

import pytest

import flows.flow_run as flow_run_module
import flows.grpo as grpo_module
import flows.train_command as train_command
import miles.config
from flows.flow_args import build_argv, flow_parameters
from flows.flow_run import flow_config, given_run_dir, handing_over


class StopAfterPrepare(Exception):
    """Raised where the flow would take the run-dir lock: everything after is the flow's own work."""


def test_miles_train_parses_once(prefect_api, tmp_path, monkeypatch):
    """The whole of `main` up to the flow's first step after its config: one parse (it was three: main's
    prepare, the flow run's name, the flow's prepare)."""
    parses = []
    real = miles.config.parse_sections
    monkeypatch.setattr(miles.config, "parse_sections", lambda *a, **k: parses.append(a[1]) or real(*a, **k))
    taken = []

    def lock(run_dir):
        taken.append(run_dir)
        raise StopAfterPrepare(run_dir)
    monkeypatch.setattr(grpo_module, "RunDirLock", lock)
    run_dir = tmp_path / "parsed-once"
    with pytest.raises(StopAfterPrepare):
        train_command.main(["--num-rollout", "2", "--run-dir", str(run_dir)])
    assert taken == [str(run_dir)]
    assert len(parses) == 1, parses


def test_the_flow_takes_the_handed_over_config_only_for_the_same_flags(monkeypatch):
    prepared = []
    monkeypatch.setattr(flow_run_module, "prepare",
                        lambda argv, **_: prepared.append(argv) or "prepared now")
    argv = ["--num-rollout", "2", "--config", "run.yaml", "--run-dir", "/r"]
    with handing_over("handed over", argv):
        assert flow_config(**flow_parameters(argv)) == "handed over"
        assert flow_config(None, ["--num-rollout", "3"]) == "prepared now"  # other flags: prepared
    assert flow_config(**flow_parameters(argv)) == "prepared now"  # a later flow in the process
    assert prepared == [["--num-rollout", "3"], build_argv(**flow_parameters(argv))]


def test_the_run_dir_is_read_off_the_flags_then_the_yaml(tmp_path):
    yaml = tmp_path / "run.yaml"
    yaml.write_text("run-dir: /from/yaml\nlr: 1.0e-3\n")
    assert given_run_dir(None, ["--run-dir", "/a", "--lr", "1"]) == "/a"
    assert given_run_dir(None, ["--run-dir=/a", "--run-dir", "/b"]) == "/b"  # the last wins, as when parsing
    assert given_run_dir(str(yaml), ["--lr", "1"]) == "/from/yaml"
    assert given_run_dir(None, [f"--config={yaml}"]) == "/from/yaml"
    assert given_run_dir(str(yaml), ["--run-dir", "/a"]) == "/a"  # the command line wins over the YAML
    assert given_run_dir(None, ["--lr", "1"]) is None
    assert given_run_dir(str(tmp_path / "missing.yaml"), []) is None  # the flow's prepare reports it
    (tmp_path / "bad.yaml").write_text("[not a mapping")
    assert given_run_dir(str(tmp_path / "bad.yaml"), ["--no-such-flag"]) is None
