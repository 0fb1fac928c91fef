"""The diagnosis in words: which phase the run is in and for how long against its median, which process
is busy or blocked where, engines alive and their queues, trackers behind; or, for a dead run, how it
ended. Every figure is computed from what `collect` gathered."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miles.compare.text import terminal_safe
from miles.config.health import HealthConfig
from miles.diagnose.probes import EngineProbe
from miles.diagnose.run_state import RunState
from miles.diagnose.stacks import ProcessStack
from miles.health.open_phase import OpenPhase, is_stalled
from miles.health.signals import Verdict

# the order processes are named in: the trainer, then its ranks, then the services
ORDER = ("trainer", "rank", "driver", "engine", "router", "delivery", "ray-")


@dataclass
class Findings:
    alive: bool
    phases: list[OpenPhase]
    stacks: list[ProcessStack]
    engines: list[EngineProbe]
    router: dict[str, Any]
    run: RunState
    red_flags: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be collected, and why
    # the slowest training rank and phase (`slowest_rank`), whom a collective waits for
    # (`push_waits`)
    ranks: list[str] = field(default_factory=list)


def _rank(name: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(ORDER) if name.startswith(p)), len(ORDER)), name


def phase_words(phase: OpenPhase | None, cfg: HealthConfig) -> str:
    if phase is None:
        return "no phase open (between iterations, starting, or closing)"
    median = f" (median {phase.median_s:.3g} s)" if phase.median_s is not None else \
        f" (no median yet: {phase.ended} ended)"
    verb = "stalled in" if is_stalled(phase, cfg) else "in"
    return f"{verb} `{phase.span.name}` of rollout {phase.span.rollout_id} for {phase.open_s:.0f} s{median}"


def process_words(stack: ProcessStack) -> str:
    label = f"{stack.name} (pid {stack.pid})"
    if stack.state in ("T", "t"):
        where = stack.where()
        return f"{label} is stopped (SIGSTOP)" + (f" at {where}" if where else "")
    if not stack.alive:
        return f"{label} is gone"
    if not stack.dump:
        return f"{label} is {stack.state_words}, no stack ({stack.error})"
    where = stack.where()
    busy = next((s for n, s, _ in stack.threads if n == "MainThread"), "")
    verb = "busy in" if busy == "active" else "waits in"
    return f"{label} {verb} {where}" if where else f"{label} is {stack.state_words}"


def engine_words(engines: list[EngineProbe]) -> list[str]:
    return [e.words for e in engines]


def tracker_words(run: RunState) -> list[str]:
    if run.delivery_error:
        return [f"tracker delivery state unreadable: {run.delivery_error}"]
    # replay-spool is the remedy only when no delivery process is left to catch up (N27)
    how = (f"delivery process {run.delivery_pid} is catching up" if run.delivery_pid is not None
           else "spooled, no delivery process running; `miles replay-spool`")
    return [f"tracker {name} is {count} journal lines behind ({how})"
            for name, count in sorted(run.delivery.items())]


def compose(f: Findings, cfg: HealthConfig) -> dict[str, Any]:
    """The verdict as a headline, detail lines and the facts behind them (verdict.json)."""
    phase = next((p for p in f.phases if p.span.lane == "trainer"), f.phases[0] if f.phases else None)
    stacks = sorted(f.stacks, key=lambda s: _rank(s.name))
    trainer_side = [s for s in stacks if s.name.startswith(("trainer", "rank"))]
    troubled = [s for s in stacks if not s.name.startswith(("trainer", "rank")) and (s.state in ("T", "t", "D") or
                                                                                     (s.alive and not s.dump))]
    dead_engines = [e for e in f.engines if not e.healthy]
    if f.alive:
        parts = [process_words(s) for s in trainer_side[:3] + troubled[:3]]
        parts += [e.words for e in dead_engines[:3]]
        headline = phase_words(phase, cfg) + (": " + "; ".join(parts) if parts else "")
        status = "stalled" if phase is not None and is_stalled(phase, cfg) else "running"
        if phase is None and f.run.starting:
            status = "starting"  # a live trainer before its first rollout's first phase (N22)
            headline = "starting: the trainer is alive, no rollout yet" + \
                (": " + "; ".join(parts) if parts else "")
    else:
        last = f"; last phase `{phase.span.name}` of rollout {phase.span.rollout_id} never ended" if phase else ""
        errors = f.run.error_lines(1)
        status = f.run.status
        if status == "finished":  # a clean end: a log line that reads like an error is not its cause
            errors = []
        headline = f"{f.run.ending()}{last}" + (f"; last error: {errors[-1]}" if errors else "")
    details = [phase_words(p, cfg) + f" [{p.span.lane}]" for p in f.phases]
    details += f.ranks
    details += [process_words(s) for s in stacks]
    details += engine_words(f.engines)
    # a run that closed cleanly took its router down with it: "not probed (run dead)" is no finding (N34)
    if f.router.get("error") and (f.alive or f.run.status == "dead"):
        details.append(f"router: {f.router['error']}")
    elif "list_workers" in f.router:
        details.append(f"router {f.router['url']} lists {f.router['list_workers']}")
    details += tracker_words(f.run)
    details += [f"red flag {v.signal} at rollout {v.rollout_id}: {v.message}" + (" (live)" if v.live else "")
                for v in f.red_flags[-5:]]
    if not f.alive and f.run.status != "finished":
        details += [f"error line: {line}" for line in f.run.error_lines()]
    details += [f"note: {n}" for n in f.notes]
    return {"status": status, "headline": headline, "details": details,
            "phase": None if phase is None else {"name": phase.span.name, "rollout_id": phase.span.rollout_id,
                                                 "lane": phase.span.lane, "open_s": phase.open_s,
                                                 "median_s": phase.median_s},
            "processes": [{"name": s.name, "pid": s.pid, "state": s.state_words, "where": s.where(),
                           "stack": bool(s.dump), "error": s.error} for s in stacks],
            "engines": [{"index": e.index, "url": e.url, "healthy": e.healthy, "error": e.error, **e.gauges}
                        for e in f.engines],
            "trackers_behind": dict(f.run.delivery), "ranks": list(f.ranks)}


def verdict_text(verdict: dict[str, Any]) -> str:
    """The verdict as the terminal shows it: a lane, phase name or log line comes from run files anyone who
    could write the run dir may have shaped, so control characters are printed as escapes (probe DG3: a
    lane holding `\x1b[2J` cleared the terminal, as compare and doctor no longer let it, N33)."""
    headline, said = verdict["headline"], f"{verdict['status']}: "
    headline = headline[len(said):] if headline.startswith(said) else headline  # status once (N34)
    return "\n".join([terminal_safe(f"VERDICT ({verdict['status']}): {headline}"), ""] +
                      [terminal_safe(f"- {line}") for line in verdict["details"]]) + "\n"
