"""The suite's scheduler hands out the longest scopes first (tests/support/scope_seconds.py), by the seconds
recorded for each, so that the end of a run is a queue of short scopes both workers share."""
from __future__ import annotations

import json

from tests.support import scope_seconds


def test_recorded_long_scopes_go_before_scopes_with_many_short_tests():
    scopes = {"units.py": dict.fromkeys(range(40)), "smollm2.py": dict.fromkeys(range(2)),
              "new.py": dict.fromkeys(range(3)), "learning.py": dict.fromkeys(range(1))}
    recorded = {"units.py": 12.0, "smollm2.py": 177.0, "learning.py": 59.0}
    assert scope_seconds.order(scopes, recorded) == ["smollm2.py", "learning.py", "units.py", "new.py"]
    # nothing recorded: by the number of tests, as xdist's own order
    assert scope_seconds.order(scopes, {}) == ["units.py", "new.py", "smollm2.py", "learning.py"]


def test_the_recorder_sums_each_scopes_phases_into_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(scope_seconds, "FILE", tmp_path / "scope_seconds.json")
    recorder = scope_seconds.Recorder(lambda nodeid: nodeid.split("::")[0])
    for nodeid, seconds in [("a.py::t1", 1.25), ("a.py::t1", 3.0), ("b.py::t2", 0.5), ("a.py::t3", 2.0)]:
        recorder.add(nodeid, seconds)
    path = recorder.write()
    assert json.loads(path.read_text()) == {"a.py": 6.2, "b.py": 0.5}
    assert scope_seconds.load() == {"a.py": 6.2, "b.py": 0.5}


def test_the_committed_file_names_the_heaviest_scopes():
    recorded = scope_seconds.load()
    assert recorded, "tests/support/scope_seconds.json is missing or unreadable: run `make test-durations`"
    heaviest = sorted(recorded, key=recorded.get, reverse=True)[:5]
    assert "tests/training/test_smollm2.py" in heaviest
