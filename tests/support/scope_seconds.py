"""How long each scheduling scope of the suite took (tests/support/scope_seconds.json), so that the workers
take the longest first: with the scopes ordered by their number of tests, the two-test SmolLM2 module and
the one-test learning run came last and one worker ran them alone for a minute at the end.

Refresh after adding or changing a heavy test: `make test-durations` (the suite with
`--record-scope-seconds`). A scope missing from the file counts `UNKNOWN_S_PER_TEST` per test: it is
new, and small ones are the common case.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

FILE = Path(__file__).with_name("scope_seconds.json")
UNKNOWN_S_PER_TEST = 1.0


def load() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def order(scopes: dict[str, dict], recorded: dict[str, float]) -> list[str]:
    """The scopes longest first: recorded seconds, else UNKNOWN_S_PER_TEST per test."""
    def seconds(scope: str) -> float:
        return recorded.get(scope, UNKNOWN_S_PER_TEST * len(scopes[scope]))
    return sorted(scopes, key=lambda scope: -seconds(scope))


class Recorder:
    """Sums the setup, call and teardown seconds of each scope from the test reports; writes FILE at the end."""

    def __init__(self, scope_of):
        self.scope_of = scope_of
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, seconds: float) -> None:
        self.seconds[self.scope_of(nodeid)] += seconds

    def write(self) -> Path:
        FILE.write_text(json.dumps({k: round(v, 1) for k, v in sorted(self.seconds.items())}, indent=1) + "\n")
        return FILE
