"""The run directory's schema (`miles.record.layout`) is the only place its names are spelled, the docs'
table (docs/user-guide/monitoring.md) documents every entry, and the start of a run (`miles.prepare`) makes files only where it says."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from miles.config import parse_config
from miles.record.layout import ENTRIES, RunLayout

ROOT = Path(__file__).resolve().parents[2]
LOG_FILES_PAGE = ROOT / "docs" / "user-guide" / "monitoring.md"  # its "Where the log files live" table


def documented_paths() -> set[str]:
    text = LOG_FILES_PAGE.read_text()
    table = text.split("## Where the log files live", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`RUN_DIR/([^`\s]*)`", table))


def entry_of(path: str) -> str | None:
    """The layout entry a documented path lies in (the longest match: profiler/summaries.jsonl, not profiler/)."""
    hits = [e.path for e in ENTRIES.values() if path == e.path.rstrip("/") or
            (e.path.endswith("/") and path.startswith(e.path))]
    return max(hits, key=len) if hits else None


def test_the_docs_table_documents_every_entry_and_nothing_else():
    documented = documented_paths()
    assert {p for p in documented if entry_of(p) is None} == set(), "docs/user-guide/monitoring.md names a file the layout does not"
    assert {e.path for e in ENTRIES.values()} - {entry_of(p) for p in documented} == set(), \
        "an entry of miles.record.layout is missing from 'Where the log files live' in docs/user-guide/monitoring.md"


def test_no_run_dir_file_name_is_spelled_outside_the_layout():
    names = {Path(e.path.rstrip("/")).name for e in ENTRIES.values() if "." in Path(e.path.rstrip("/")).name[1:]}
    names.add("mlartifacts")
    spelled = []
    for folder in ("miles", "flows", "tasks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "layout.py" and path.parent.name == "record":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
                    if node.value in names or any(node.value.endswith("/" + n) for n in names):
                        spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert spelled == []


def test_run_layout_joins_every_entry():
    layout = RunLayout("/r")
    assert layout.journal == Path("/r/metrics.jsonl") and layout.py_spy == Path("/r/profiler/py-spy")
    assert layout.log("router.log") == Path("/r/logs/router.log")
    with pytest.raises(AttributeError, match="no entry 'journals'"):
        layout.journals


def test_resolve_names_paths_and_makes_no_file(tmp_path, monkeypatch):
    from miles.prepare import resolve_run

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path / "cache"))
    config = resolve_run(parse_config(["--run-dir", str(tmp_path / "run")]))
    assert config.rollout.hf_checkpoint.startswith(str(tmp_path / "cache"))  # the tiny model, by path
    assert config.rollout.prompt_data == str(tmp_path / "cache" / "tiny-task" / "train.jsonl")
    assert config.train.save == str(RunLayout(tmp_path / "run").checkpoints)
    assert list(tmp_path.iterdir()) == []  # no cache, no data, no run dir: nothing was made


def test_prepare_checks_and_writes_the_tiny_data_but_leaves_the_model_to_its_step(tmp_path, monkeypatch, capsys):
    from miles.config import ConfigError
    from miles.prepare import prepare
    from miles.tiny.defaults import tiny_model_missing

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="--custom-rm-path"):  # a bad hook fails before the model is made
        prepare(["--run-dir", str(tmp_path / "run"), "--custom-rm-path", "nowhere.reward"])
    config = prepare(["--run-dir", str(tmp_path / "run")], make_model=False)
    assert Path(config.rollout.prompt_data).is_file() and Path(config.rollout.eval_prompt_data[1]).is_file()
    assert tiny_model_missing(config) == Path(config.rollout.hf_checkpoint)  # made by make_tiny_model, visibly
    assert not Path(config.rollout.hf_checkpoint).exists()
    assert "[prepare]" not in capsys.readouterr().out


def test_the_trainer_and_the_plain_driver_take_only_a_prepared_config():
    from miles.train import train
    from miles.trainer import RLTrainer

    raw = parse_config([])
    with pytest.raises(ValueError, match="prepared config"):
        RLTrainer.start(raw, "http://127.0.0.1:1", ["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="prepared config"):
        train(raw)
