"""--on-red-flag stop ends a hung run by SIGINT to its main thread. A run started with SIGINT ignored (a
background job of a non-interactive shell, `python -m miles.train ... &` in a script) dropped that interrupt
and hung on; the stall reaction now makes SIGINT raise while the loop runs, and puts the ignore back after."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import signal, sys, threading
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a non-interactive shell starts
from miles.config import parse_config
from miles.diagnose.stall_reaction import StallReaction

class Timer:  # the health watch's stall timer, not needed: the test fires the reaction's interrupt itself
    def start(self): pass
    def stop(self): pass

reaction = StallReaction(parse_config(["--on-red-flag", sys.argv[1], "--run-dir", sys.argv[2]]))
reaction.timer = Timer()
reaction.before_iteration(0)
print("while the loop runs:", signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
if reaction.stops:
    threading.Timer(0.5, reaction._interrupt_loop).start()
try:
    threading.Event().wait(20 if reaction.stops else 0)  # a phase that never returns (an engine SIGSTOPped)
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
reaction.end(None)
print("after the loop:", signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
'''


def run(on_red_flag: str, tmp_path: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, on_red_flag, str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_a_run_started_with_sigint_ignored_is_still_stopped(tmp_path):
    assert run("stop", tmp_path) == ["while the loop runs: True", "interrupted", "after the loop: True"]


def test_without_stop_sigint_is_left_as_it_was(tmp_path):
    assert run("warn", tmp_path) == ["while the loop runs: False", "not interrupted", "after the loop: True"]


def test_a_handler_already_set_is_left_alone():
    from miles.diagnose.stall_reaction import interruptible_main_thread

    mine = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, handler := (lambda *_: None))
        assert interruptible_main_thread() is None and signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, mine)
