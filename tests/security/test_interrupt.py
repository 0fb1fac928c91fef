"""Probe ASY3 (in part): Ctrl-C during a run ended in a 40-line KeyboardInterrupt traceback. An entry point
run by `run_main` (`python -m miles.train`, `miles engine`, `miles router`, ...) now says one line and
exits 130, as a shell expects of an interrupted command; the resume was already right."""
from __future__ import annotations

import signal
import subprocess
import sys

CHILD = """
import os, signal, time
from miles.config import run_main

def main():
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the terminal sends it
        time.sleep(60)
    finally:
        print("closed", flush=True)  # what main holds is closed as the interrupt unwinds

run_main(main, "python -m miles.train")
"""


def test_ctrl_c_is_one_line_and_exit_130():
    # as at a terminal: a job started in the background of a non-interactive shell (CI's, or a
    # suite run with `&`) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stdout == "closed\n" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "python -m miles.train: interrupted (Ctrl-C); a run resumes from its last checkpoint with the same command"]
