"""A weight push to a hung engine must not keep a stopped run alive: the stall reaction's SIGINT ends the
push's wait at once and the process exits without waiting for the push (a thread pool's exit waited)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import signal, threading, time
from miles.backends import sync
from miles.diagnose.stall_reaction import interruptible_main_thread

interruptible_main_thread()  # as the stall reaction does: this test's process may inherit SIGINT ignored

class HungEngine:
    @staticmethod
    def push_weights_from_disk(*args, **kwargs):
        time.sleep(120)  # an engine that never answers (SIGSTOPped)

sync._engine_weights = lambda: HungEngine
threading.Timer(1.0, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)).start()
try:
    sync.push_disk_each(["http://127.0.0.1:1", "http://127.0.0.1:2"], "/weights", 1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
'''


def test_an_interrupted_push_to_a_hung_engine_lets_the_process_exit():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.stdout.strip() == "interrupted", done.stderr[-2000:]
    assert time.monotonic() - started < 60  # not the push's 120 s
