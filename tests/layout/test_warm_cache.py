"""The suite's background maker of the cached tiny models (tests/support/warm_cache.py): started only when a
model is missing, it holds the cache's lock while it makes one (so a test asking waits for it instead of making
a second), and the suite's end stops it by its PID."""
from __future__ import annotations

import fcntl

from tests.support import warm_cache
from tests.support.wait import wait_for


def test_nothing_is_started_when_the_models_are_made(tmp_path, monkeypatch):
    from miles.tiny.recipes import base_model_dir, tool_model_dir

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))
    assert warm_cache.missing()
    for model in (base_model_dir(), tool_model_dir()):
        model.mkdir(parents=True)
        (model / "warmstart.json").write_text("{}")
    assert not warm_cache.missing()
    assert warm_cache.start(tmp_path / "warm.log") is None


def test_a_missing_model_is_made_under_the_caches_lock_and_the_end_stops_the_maker(tmp_path, monkeypatch):
    from miles.tiny.recipes import base_model_dir

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))
    lock = tmp_path / f".{base_model_dir().name}.lock"
    maker = warm_cache.start(tmp_path / "warm.log")
    try:
        def held() -> bool:  # the maker took the addition model's lock: a test asking now waits for it
            if not lock.exists():
                return False
            with open(lock) as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(f, fcntl.LOCK_UN)
                return False

        wait_for(held, 120, "the maker to take the lock",
                 gone=lambda: maker.poll() is not None and f"the maker exited with {maker.returncode}" or None)
    finally:
        assert warm_cache.stop(maker, tmp_path / "warm.log") is None  # still making: stopped, no failure
    assert maker.returncode is not None
    assert not (base_model_dir() / "warmstart.json").exists()  # a half-made model is never found made
