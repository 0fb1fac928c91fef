"""What `miles train` prints: the `mlflow ui` command beside a link to a local store, or the UI it started; the dashboard command."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_server import PrefectServer
from flows.where import print_finished, where_to_look
from miles.config import parse_config
from miles.config.commands import runnable
from miles.prepare import resolve_run
from miles.mlflow_ui.launch import MlflowUi
from miles.run.scorecard import scorecard


def test_the_link_to_a_local_store_comes_with_the_command_that_serves_it(tmp_path, capsys):
    config = resolve_run(parse_config(["--use-mlflow", "--run-dir", str(tmp_path / "r")]))
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    command = (f"{runnable('mlflow')} ui --backend-store-uri sqlite:///{tmp_path / 'mlflow.db'} --host 127.0.0.1 --port 5000"
               " --workers 1 --app-name miles")
    assert ("MLflow", command) in where_to_look(config, server)
    link = "http://127.0.0.1:5000/#/experiments/1/runs/abc"
    card = scorecard(tmp_path / "r")
    card.links["mlflow-run"] = link
    print_finished(card, server, config)
    out = capsys.readouterr().out
    assert f" MLflow  " in out and f" {link}  (serve it first: {command})\n" in out

    ui = MlflowUi(url="http://127.0.0.1:5001", pid=4242, log_path=tmp_path / "ui.log")
    assert ("MLflow", "http://127.0.0.1:5001  (mlflow ui, pid 4242; stop it with `kill 4242`)") in where_to_look(
        config, server, ui)
    print_finished(card, server, config, ui)
    assert "serve it first" not in capsys.readouterr().out


def test_a_tracking_server_is_linked_as_it_is(tmp_path, capsys):
    config = resolve_run(parse_config(["--use-mlflow", "--mlflow-tracking-uri", "http://mlflow:5000",
                                   "--run-dir", str(tmp_path)]))
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    assert ("MLflow", "open http://mlflow:5000") in where_to_look(config, server)
    card = scorecard(tmp_path)
    card.links["mlflow-run"] = "http://mlflow:5000/#/x"
    print_finished(card, server, config)
    assert "serve it first" not in capsys.readouterr().out


def test_the_dashboard_command_is_printed(tmp_path):
    config = parse_config(["--run-dir", str(tmp_path / "r")])
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    assert ("dashboard", f"{runnable('miles')} dashboard {(tmp_path / 'r').resolve()} --follow") in where_to_look(config, server)


def test_printed_commands_run_without_an_activated_venv(tmp_path):
    """After `make run` the venv is not on PATH: a hint must name the venv's copy, not a bare `miles`."""
    from miles.config.commands import bin_dir

    assert runnable("miles", path="/usr/bin:/bin") in (str(bin_dir() / "miles"),
                                                       str((bin_dir() / "miles").relative_to(Path.cwd()))
                                                       if (bin_dir() / "miles").is_relative_to(Path.cwd()) else "")
    assert runnable("miles", path=str(bin_dir())) == "miles"  # activated: the bare name runs this copy
    assert runnable("no-such-tool-here", path="/usr/bin") == "no-such-tool-here"


def test_no_traces_line_for_a_run_that_did_not_profile(tmp_path, capsys):
    config = resolve_run(parse_config(["--run-dir", str(tmp_path / "r")]))
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    (tmp_path / "r").mkdir()
    print_finished(scorecard(tmp_path / "r"), server, config)
    out = capsys.readouterr().out
    assert "\n  traces" not in out and "scorecard of" in out


def test_tensorboard_off_is_said_and_wandb_offline_gives_one_sync_command(tmp_path):
    config = resolve_run(parse_config(["--use-wandb", "--run-dir", str(tmp_path / "r")]))
    rows = dict(where_to_look(config, PrefectServer(api_url="http://127.0.0.1:4200/api")))
    assert rows["TensorBoard"].startswith("off (--use-tensorboard")
    assert rows["wandb"] == (f"offline: {runnable('wandb')} sync {config.tracking.wandb_dir}/wandb/offline-run-*"
                             "  (one run; a folder per chunk)")
    on = resolve_run(parse_config(["--use-tensorboard", "--run-dir", str(tmp_path / "t")]))
    assert dict(where_to_look(on, PrefectServer(api_url="http://127.0.0.1:4200/api")))["TensorBoard"].endswith(
        f"--logdir {on.tracking.tensorboard_dir}")


def test_where_to_look_says_how_deployments_appear(tmp_path, capsys):
    """An empty Deployments page in the Prefect UI is expected until `make deploy` (G3 of the first-hour review)."""
    from flows.where import print_where_to_look

    config = resolve_run(parse_config(["--run-dir", str(tmp_path / "r")]))
    print_where_to_look(config, PrefectServer(api_url="http://127.0.0.1:4200/api"))
    assert "Deployments page stays empty until `make deploy`" in capsys.readouterr().out


def test_the_terminal_prints_the_wall_time_of_the_flows_scorecard(tmp_path, capsys):
    """First-hour N8: the terminal's scorecard said 3m12s (measured after the teardown) where the Prefect
    artifact and MLflow's description, made by finish_run, said 2m54s; now the terminal prints the
    card finish_run made (the flow's return value), its wall time from the command's start."""
    from flows.flow_run import STARTED_AT_ENV, command_started_at

    config = resolve_run(parse_config(["--run-dir", str(tmp_path / "r")]))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text('{"rollout_id": 0, "time": 1.0, "metrics": {}}\n')
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    print_finished(scorecard(tmp_path / "r", seconds=174.0), server, config)  # finish_run's: 2m54s
    assert "1 (0..0) in 2m54s wall time" in capsys.readouterr().out

    import os
    import time

    os.environ[STARTED_AT_ENV] = repr(time.time() - 30)  # `miles train` started 30 s before its flow
    try:
        assert 29 < time.time() - command_started_at() < 60
        os.environ[STARTED_AT_ENV] = "soon"  # unreadable: the flow's own start
        assert time.time() - command_started_at() < 5
    finally:
        os.environ.pop(STARTED_AT_ENV, None)


def test_both_drivers_print_the_same_next_steps_but_the_flows_prefect_row(tmp_path, capsys):
    """One writer of the "where to look next" rows: the flow's card adds only its Prefect row."""
    from miles.train import next_steps

    config = resolve_run(parse_config(["--use-mlflow", "--run-dir", str(tmp_path / "r")]))
    server = PrefectServer(api_url="http://127.0.0.1:4200/api")
    card = scorecard(tmp_path / "r")
    card.links["prefect-training-run"] = "http://127.0.0.1:4200/runs/flow-run/abc"
    print_finished(card, server, config)
    prefect = ("Prefect", "http://127.0.0.1:4200/runs/flow-run/abc  (the run that trains)")
    assert card.next_steps == [*next_steps(config)[:2], prefect, *next_steps(config)[2:]]
    assert dict(card.next_steps)["MLflow"].startswith(f"{runnable('mlflow')} ui --backend-store")
