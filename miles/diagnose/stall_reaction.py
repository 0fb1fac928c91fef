"""The live stall red flag as a loop observer: the health watch's timer (`miles.health.stall_timer`) runs
beside the loop; its first live stall writes the diagnose bundle (once), tells the observers that listen
(`live_red_flag`: Prefect's events and artifact), and with --on-red-flag stop ends the hung run.

A hung phase never returns to the loop, so the stop cannot wait for the iteration's end: the loop's
thread is interrupted (SIGINT to the main thread wakes a blocking wait; another thread gets the
exception at its next Python line) and `train_rollouts` turns that into `RedFlagStop`. A process that
started with SIGINT ignored (a background job of a non-interactive shell: `python -m miles.train ... &` in a
script) would drop that interrupt and hang on, so while the loop runs on the main thread an ignored SIGINT
is handled as Python does by default (KeyboardInterrupt), and put back at the end.
"""
from __future__ import annotations

import ctypes
import signal
import threading
from pathlib import Path
from typing import Sequence

from miles.config.secrets import scrubber_for
from miles.diagnose.bundle import Diagnosis, collect
from miles.health import RedFlagStop, Verdict, stop_message
from miles.health.stall_timer import StallTimer
from miles.run.observer import Observer


class StallReaction(Observer):
    def __init__(self, config, listeners: Sequence[Observer] = ()):
        self.config, self.run_dir = config, Path(config.train.run_dir)
        self.timer = StallTimer(self.run_dir, config.health, self.react)
        self.scrubber = scrubber_for(config)
        self.listeners = list(listeners)
        self.stops = config.health.on_red_flag == "stop"
        self.diagnosis: Diagnosis | None = None
        self.stop_reason: str | None = None
        self.loop_thread: int | None = None
        self.sigint_before = None  # SIGINT's handler before this observer made it raise, to put back at the end

    def before_iteration(self, rollout_id: int) -> None:
        if self.loop_thread is None:
            self.loop_thread = threading.get_ident()
            if self.stops:
                self.sigint_before = interruptible_main_thread()
            self.timer.start()

    def react(self, verdict: Verdict) -> None:
        try:
            self.diagnosis = collect(self.run_dir, self.config.health, self.scrubber)
            print(f"[health] diagnose bundle {self.diagnosis.path}\n{self.diagnosis.text}", end="", flush=True)
        except Exception as exc:  # the flag still counts without its bundle
            print(f"[health] diagnose bundle failed: {type(exc).__name__}: {exc}", flush=True)
        for listener in self.listeners:
            hook = getattr(listener, "live_red_flag", None)  # observers need not subclass Observer
            if hook is not None:
                hook(verdict, self.diagnosis)
        if self.stops:
            bundle = f"; diagnose bundle {self.diagnosis.path}" if self.diagnosis else ""
            self.stop_reason = f"{stop_message([verdict])}{bundle}"
            print(f"[health] stopping the hung run: {self.stop_reason}", flush=True)
            self._interrupt_loop()

    def _interrupt_loop(self) -> None:
        if self.loop_thread is None:
            return
        if self.loop_thread == threading.main_thread().ident:
            signal.pthread_kill(self.loop_thread, signal.SIGINT)  # KeyboardInterrupt, even inside a blocking wait
        else:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.loop_thread),
                                                       ctypes.py_object(KeyboardInterrupt))

    def raise_if_stopped(self, error: BaseException) -> None:
        """RedFlagStop instead of the interrupt this observer sent (other errors are not its own)."""
        if self.stop_reason is not None and isinstance(error, KeyboardInterrupt):
            raise RedFlagStop(f"{self.stop_reason}. No checkpoint of the hung rollout") from None

    def end(self, outcome) -> None:
        self.timer.stop()
        if self.sigint_before is not None:
            signal.signal(signal.SIGINT, self.sigint_before)
            self.sigint_before = None


def interruptible_main_thread():
    """Make SIGINT raise KeyboardInterrupt in this, the main, thread if it is ignored or left to the OS;
    the handler it had when changed, else None (a thread other than the main one, or a handler already set:
    Python's own, or one the user's code installed, is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    if handler not in (signal.SIG_IGN, signal.SIG_DFL, None):
        return None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return handler
