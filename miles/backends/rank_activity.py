"""A training rank's long phases, announced for whoever waits on it (`miles diagnose`).

A daemon thread looks at the rank's phase recorder (`RankPhaseRecorder.current`) every BEAT_S. A
phase that has lasted over ANNOUNCE_S, the rank's own work in it or its wait for a pipeline
neighbour, is written to RUN_DIR/collectives/train-rank-<N>.json with a heartbeat renewed while
it lasts, and marked done once it ends (`miles.run.collective_waits`). Short phases write
nothing: on the rank's own thread the cost is one assignment per span. Each record holds how many
collectives the rank had gone into this rollout (`mark`, the recorder's `arrive`): a rank past
more of them than a peer waits for that peer. So when training hangs in a collective, the records
say which rank is still in its own work, which stopped answering (SIGSTOP, a hung process) and
which is gone, and the others wait for it.
"""
from __future__ import annotations

import threading
import time

from miles.backends.rank_phases import WAIT, RankPhaseRecorder
from miles.run.collective_waits import (BEAT_S, DONE, TRAIN, WAITING, WORKING, CollectiveState,
                                        write_state)

ANNOUNCE_S = 1.0  # a phase this long is announced


class RankActivity:
    """The announcing thread of one rank (see the module); `start` once the rank has its
    coordinates."""

    def __init__(self, rec: RankPhaseRecorder, rank: int, world_size: int, run_dir: str):
        self.rec, self.rank, self.world_size, self.run_dir = rec, rank, world_size, run_dir
        self._announced: tuple | None = None  # the recorder's `current` that was written
        self._state: CollectiveState | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="miles-rank-activity")

    def start(self) -> None:
        """A first record (done: the rank started), so a peer is named by its coordinates even
        before its first long phase; then the thread."""
        try:
            started = self._state_for(("start", "", "", time.time()))
            started.state = DONE
            write_state(self.run_dir, started)
        except OSError:
            pass
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_S)
            try:
                self.tick(time.time())
            except OSError:  # a full or lost disk: announcing is best effort, training goes on
                pass

    def tick(self, now: float) -> None:
        """One look at the recorder: end, renew or begin an announcement."""
        current = self.rec.current
        if self._state is not None and current is not self._announced:
            self._state.state, self._state.beat = DONE, now
            write_state(self.run_dir, self._state)
            self._state = self._announced = None
        if self._state is not None:
            self._state.beat = now
            write_state(self.run_dir, self._state)
        elif current is not None and now - current[3] > ANNOUNCE_S:
            self._state, self._announced = self._announce(current), current

    def _announce(self, current: tuple[str, str, str, float]) -> CollectiveState:
        state = self._state_for(current)
        write_state(self.run_dir, state)
        return state

    def _state_for(self, current: tuple[str, str, str, float]) -> CollectiveState:
        phase, kind, what, start = current
        mark = self.rec.arrivals  # unchanged while `current` is: marks fall between phases
        if not what and mark:
            what = f"the ranks' collective after {self.rec.arrived}"
        state = CollectiveState.entering(self.rank, self.rec.coords.name, self.rec.rollout_id or 0,
                                         phase, what, self.world_size, kind=TRAIN,
                                         state=WAITING if kind == WAIT else WORKING)
        state.entered, state.mark = start, mark
        return state
