"""`make test` makes the suite's missing models before the suite, together (tests/support/warm_cache.py):
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
