"""Review N34: a warning's line read `[health] WARN warning rollout_train_time ...` ("warning"
twice); a warning is the WARN itself, and a red flag keeps `WARN RED FLAG`."""
from __future__ import annotations

from miles.health import RED, Verdict
from miles.health.signals import SIGNALS, WARNING


def test_a_warning_says_warn_once_and_a_red_flag_says_red_flag():
    signal = next(iter(SIGNALS))
    warning = Verdict(3, signal, WARNING, "slow", {"x": 1.0}).line()
    assert warning.startswith(f"[health] WARN {signal} at rollout 3: slow")
    assert "warning" not in warning.split(":", 1)[0]
    red = Verdict(3, signal, RED, "bad", {"x": 1.0}).line()
    assert red.startswith(f"[health] WARN RED FLAG {signal} at rollout 3: bad")
