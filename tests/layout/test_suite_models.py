"""`make test` makes the suite's missing models before the suite, as many at once as the machine has cores
(tests/support/warm_cache.py):
nothing is started when all are made, only the missing ones otherwise, and a failure is named."""
from __future__ import annotations

from tests.support import warm_cache


def with_models(monkeypatch, tmp_path, made: set[str], code: dict[str, str]) -> None:
    markers = {name: tmp_path / f"{i}.marker" for i, name in enumerate(code)}
    for name in made:
        markers[name].write_text("{}")
    monkeypatch.setattr(warm_cache, "suite_model_markers", lambda: markers)
    monkeypatch.setattr(warm_cache, "SUITE_MODELS", code)


def test_all_made_starts_nothing(monkeypatch, tmp_path, capsys):
    with_models(monkeypatch, tmp_path, {"a", "b"}, {"a": "raise SystemExit(3)", "b": "raise SystemExit(3)"})
    assert warm_cache.make_suite_models() == 0
    assert capsys.readouterr().out == ""


def test_only_the_missing_are_made_and_a_failure_is_named(monkeypatch, tmp_path, capsys):
    out = tmp_path / "ran"
    with_models(monkeypatch, tmp_path, {"a"}, {
        "a": "raise SystemExit(3)",  # made: never run
        "b": f"open({str(out)!r}, 'w').write('b')",
        "c": "import sys; print('no wheel'); sys.exit(4)"})
    assert warm_cache.make_suite_models() == 1
    captured = capsys.readouterr()
    assert out.read_text() == "b" and "  b: made in " in captured.out
    assert "making the test suite's models" in captured.out
    assert "making the c failed (exit 4):\nno wheel" in captured.err and " a" not in captured.err


def test_the_markers_are_the_files_the_makers_write_last():
    from miles.config.checkpoints import MADE
    from miles.tiny.recipes import base_model_dir, tool_model_dir

    markers = warm_cache.suite_model_markers()
    assert set(markers) == set(warm_cache.SUITE_MODELS)
    assert markers["tiny addition model"] == base_model_dir() / "warmstart.json"
    assert markers["tiny tool model"] == tool_model_dir() / "warmstart.json"
    assert markers["SmolLM2-135M-Instruct"].name == MADE


def holding_maker(log, name: str, hold_s: float) -> str:
    """A stand-in maker that logs its start and end and stays running until every maker has started or
    `hold_s` has passed (so makers allowed to run together are seen together)."""
    return (f"import os, time\n"
            f"def say(what):\n"
            f"    fd = os.open({str(log)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT); os.write(fd, what.encode()); os.close(fd)\n"
            f"say('start {name}\\n')\n"
            f"deadline = time.monotonic() + {hold_s}\n"
            f"while time.monotonic() < deadline and open({str(log)!r}).read().count('start') < 3:\n"
            f"    time.sleep(0.05)\n"
            f"say('end {name}\\n')\n")


def events(log) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in log.read_text().splitlines()]


def most_at_once(log) -> int:
    running = most = 0
    for what, _ in events(log):
        running += 1 if what == "start" else -1
        most = max(most, running)
    return most


def test_at_most_lanes_are_made_at_once_the_first_listed_first(monkeypatch, tmp_path):
    """Each maker runs torch on one thread: on two cores two at a time, in SUITE_MODELS's order (the longest
    first), the next one as soon as a lane is free."""
    log = tmp_path / "log"
    with_models(monkeypatch, tmp_path, set(), {name: holding_maker(log, name, 1.5) for name in ("a", "b", "c")})
    assert warm_cache.make_suite_models(lanes=2) == 0
    seen = events(log)
    assert most_at_once(log) == 2
    assert sorted(seen[:2]) == [("start", "a"), ("start", "b")]
    assert seen.index(("start", "c")) > seen.index(next(e for e in seen if e[0] == "end"))  # once a lane was free


def test_the_lanes_are_the_machines_cores(monkeypatch, tmp_path):
    log = tmp_path / "log"
    with_models(monkeypatch, tmp_path, set(), {name: holding_maker(log, name, 0.3) for name in ("a", "b", "c")})
    monkeypatch.setattr(warm_cache.os, "cpu_count", lambda: 1)
    assert warm_cache.make_suite_models() == 0
    assert events(log) == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"), ("start", "c"), ("end", "c")]
