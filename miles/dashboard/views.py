"""What each dashboard endpoint answers, computed from a run's files (no HTTP here)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from miles.dashboard.headline import run_state, summary as run_headline
from miles.dashboard.run_files import RunFiles
from miles.health.report import panels
from miles.record.eval_prompts import read_eval_prompts
from miles.record.journal import BOOKKEEPING, NON_FINITE
from miles.record.names import STEP_KEYS, step_key
from miles.record.timeline import Span, chrome_trace, lane_order

NOT_AVAILABLE = "not available"
# The health watch's signal name of each panel, in panel order (its verdicts are marked there).
WATCH_SIGNALS = ("loss", "raw_reward", "kl_loss", "train_rollout_logprob_abs_diff", "entropy_loss", "grad_norm",
                 "rollout_train_time", "pg_clipfrac")
# The page's "What to watch" table: (healthy pattern, red flag) per panel, in panel order.
WATCH_NOTES = (
    # GRPO's policy loss averages advantages of mean 0: near 0 (1e-8 on the tiny run)
    ("near 0 by construction in GRPO (zero-mean advantages)", "spike -> crash within an iteration"),
    ("trending up, with healthy variance", "saturates near a single value (collapse)"),
    ("bounded, drifts up over time", "sudden jump (policy diverged from ref)"),
    ("stable and small (<< 1.0)", "climbing without bound -> train/inference precision drift"),
    ("slowly decreasing", "falls to ~0 too fast (mode collapse)"),
    ("< clip_grad", "repeatedly hitting the clip threshold"),
    ("roughly balanced", "one >> other -> resource imbalance"),
    ("< 0.2", "> 0.5: the policy moves fast -> drop LR"),
)


class NotFound(LookupError):
    """A rollout or sample the run does not have."""


HEALTHY = "healthy"  # the watch ran and flagged nothing: health.jsonl is only written on a flag


def health_watch(files: RunFiles) -> dict[str, Any]:
    """What the health watch left: `available` (health.jsonl holds verdicts), `healthy` (no verdict, but the
    journal carries the watch's health/<signal> figures: it ran and flagged nothing), else not available
    (no watch ran: --health-watch off, or a run from before it)."""
    journal = files.journal().rows
    signals = sorted({k.split("/", 1)[1] for row in journal for k in row if k.startswith("health/")})
    watched = [row for row in journal if (row.get("rollout_id") or 0) >= 0 and any(k.startswith("health/") for k in row)]
    lines = files.health()
    state = "available" if lines.rows else HEALTHY if signals else NOT_AVAILABLE
    # per severity, each signal's flag count: the banner's amber (warnings only) or red line
    # (N32: a run with warnings lost the health line on every view)
    flagged: dict[str, dict[str, int]] = {"red": {}, "warning": {}}
    for row in lines.rows:
        counts = flagged.get(str(row.get("severity")))
        if counts is not None:
            counts[str(row.get("signal"))] = counts.get(str(row.get("signal")), 0) + 1
    return {"state": state, "signals": signals, "rollouts": len(watched), **flagged}


def run_summary(files: RunFiles, follow: bool) -> dict[str, Any]:
    journal = files.journal().rows
    status = files.status()
    watch_state = health_watch(files)
    # not missing: a healthy run writes no health.jsonl, a run that did not profile no summaries
    absent_by_design = {"health"} if watch_state["state"] == HEALTHY else set()
    absent_by_design |= {"profiler"}
    missing = [f"{name} ({info['path']})" for name, info in status.items()
               if not info["present"] and name not in absent_by_design]
    off = [] if status["profiler"]["present"] else ["profiling off (no profiler window in this run)"]
    corrupt = [f"{name}: {info['skipped']} unreadable lines" for name, info in status.items() if info.get("skipped")]
    config = files.config()
    last = max((row.get("rollout_id", -1) for row in journal), default=None)
    num_rollout = num_rollout_of(config)
    return {"run_dir": str(files.run_dir), "name": files.run_dir.name, "follow": follow,
            # the eval before training has a line of its own (rollout id -1): not an iteration
            "iterations": len({row.get("rollout_id") for row in journal if (row.get("rollout_id") or 0) >= 0}),
            "last_rollout_id": last, "num_rollout": num_rollout,
            "state": run_state(files.run_dir, last, num_rollout),
            # metrics recorded without a value (NaN or infinite): the health watch's non_finite flag
            "non_finite": sorted({name for row in journal for name in row.get(NON_FINITE, ())}),
            "files": status, "missing": missing, "corrupt": corrupt, "off": off, "health": watch_state}


def num_rollout_of(config: dict[str, Any]) -> int | None:
    value = config.get("rollout.num_rollout") or config.get("num_rollout")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resumes(files: RunFiles) -> list[dict[str, Any]]:
    """Where a trainer took over from a checkpoint: each chunk of `miles train` after the first, and a
    resume after a crash. Their first iteration reopens the trackers and reloads the weights (seconds of
    perf/train_time that are no anomaly: first-hour N15); the x of each on every step axis."""
    journal = {row.get("rollout_id"): row for row in files.journal().rows}
    out = []
    for span in files.timeline().rows:
        if span.get("name") != "resume" or span.get("lane") != "trainer" or span.get("rollout_id") is None:
            continue
        rid = span["rollout_id"]
        row = journal.get(rid, {})
        out.append({"rollout_id": rid, "start": span["start"], "end": span["end"],
                    "x": {axis: row.get(axis, rid) for axis in STEP_KEYS if axis != "eval/step"}})
    return out


def _clip_grad(files: RunFiles) -> float:
    config = files.config()
    value = config.get("train.clip_grad", config.get("clip_grad", 1.0))
    try:
        return float(value)
    except (TypeError, ValueError):
        return 1.0


def _series(journal: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Every metric as points (its own step axis, value), in journal order."""
    out: dict[str, dict[str, Any]] = {}
    for row in journal:
        for key, value in row.items():
            if key in BOOKKEEPING or key in STEP_KEYS or not isinstance(value, (int, float)):
                continue
            axis = step_key(key)
            s = out.setdefault(key, {"step_key": axis, "x": [], "y": []})
            s["x"].append(row.get(axis, row.get("rollout_id")))
            s["y"].append(value)
    return out


def metrics(files: RunFiles) -> dict[str, Any]:
    series = _series(files.journal().rows)
    namespaces: dict[str, list[str]] = defaultdict(list)
    for key in sorted(series):
        namespaces[key.split("/", 1)[0] if "/" in key else "other"].append(key)
    return {"namespaces": dict(namespaces), "series": series, "resumes": resumes(files)}


def watch(files: RunFiles) -> dict[str, Any]:
    """The page's eight "What to watch" panels, with their thresholds and the health watch's verdicts."""
    journal = files.journal().rows
    series = _series(journal)
    step_of_rollout = {row.get("rollout_id"): row for row in journal}
    health = files.health()
    verdicts_by_signal: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for v in health.rows:
        verdicts_by_signal[str(v.get("signal", ""))].append(v)
    out, shown = [], set()
    for panel, signal, (healthy, red_flag) in zip(panels(_clip_grad(files)), WATCH_SIGNALS, WATCH_NOTES):
        names = {signal, *panel.keys, *(k.split("/")[-1] for k in panel.keys)}
        matched = [name for name in verdicts_by_signal if name in names or name.split("/")[-1] in names]
        shown.update(matched)
        verdicts = [v for name in matched for v in verdicts_by_signal[name]]
        axis = step_key(panel.keys[0])
        flags = [step_of_rollout.get(v.get("rollout_id"), {}).get(axis, v.get("rollout_id")) for v in verdicts
                 if v.get("severity") != "ok"]
        if signal == "grad_norm":
            red_flag = _grad_norm_rule(files, series.get("train/grad_norm"))
        out.append({"title": panel.title, "keys": list(panel.keys), "threshold": panel.hline, "flag_steps": flags,
                    "threshold_label": panel.hline_label,
                    "healthy": healthy, "red_flag": red_flag,
                    "series": {k: series[k] for k in panel.keys if k in series}, "verdicts": verdicts})
    others = [v for name, vs in verdicts_by_signal.items() if name not in shown for v in vs]
    state = health_watch(files)
    return {"panels": out, "other_verdicts": others, "health": state["state"], "health_signals": state["signals"],
            "health_rollouts": state["rollouts"], "resumes": resumes(files)}


def _grad_norm_rule(files: RunFiles, series: dict[str, Any] | None) -> str:
    """The grad_norm panel's red flag as the watch judges it, with the run's share at clip: "repeatedly
    hitting the clip threshold" beside 29 of 100 rollouts at clip and no flag read as a contradiction
    (first-hour N11)."""
    config, clip = files.config(), _clip_grad(files)
    window = _number(config.get("health.health_grad_norm_window", config.get("health_grad_norm_window")), 20)
    share = _number(config.get("health.health_grad_norm_clip_share", config.get("health_grad_norm_clip_share")), 1.0)
    every = "every one" if share >= 1 else f"{share:.0%}"
    rule = f"at or above clip_grad={clip:g} in {every} of {window:g} rollouts in a row"
    values = (series or {}).get("y") or []
    if values:
        rule += f" (this run: at clip in {sum(v >= clip for v in values)} of {len(values)}; short runs of it are normal)"
    return rule


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def timeline(files: RunFiles, rollout_id: int | None = None) -> dict[str, Any]:
    spans = files.timeline().rows
    if rollout_id is not None:
        spans = _of_rollout(spans, rollout_id)
    lanes = sorted({str(s.get("lane")) for s in spans}, key=lane_order)
    start = min((float(s["start"]) for s in spans), default=None)
    end = max((float(s["end"]) for s in spans), default=None)
    return {"available": files.timeline().present, "lanes": lanes, "spans": spans, "start": start, "end": end,
            "utilization": utilization(spans, lanes), "profiler": profiler(files)}


def utilization(spans: list[dict[str, Any]], lanes: list[str]) -> dict[str, float]:
    """Each lane's busy share of the iterations' wall time (from the first span of a rollout to the last)."""
    trained = [s for s in spans if s.get("rollout_id") is not None] or spans
    if not trained:
        return {}
    lo, hi = min(float(s["start"]) for s in trained), max(float(s["end"]) for s in trained)
    busy: dict[str, float] = defaultdict(float)
    for s in spans:
        if (s.get("args") or {}).get("kind") == "wait":  # a rank waiting for the others is not busy
            continue
        busy[str(s.get("lane"))] += max(min(float(s["end"]), hi) - max(float(s["start"]), lo), 0.0)
    return {lane: min(busy[lane] / (hi - lo), 1.0) if hi > lo else 0.0 for lane in lanes}


def _of_rollout(spans: list[dict[str, Any]], rollout_id: int) -> list[dict[str, Any]]:
    """The rollout's spans, and the spans that know no rollout (engine decoding) inside its time."""
    own = [s for s in spans if s.get("rollout_id") == rollout_id]
    if not own:
        return []
    start, end = min(float(s["start"]) for s in own), max(float(s["end"]) for s in own)
    return own + [s for s in spans if s.get("rollout_id") is None and float(s["start"]) < end
                  and float(s["end"]) > start]


def chrome(files: RunFiles) -> dict[str, Any]:
    spans = []
    for row in files.timeline().rows:
        try:
            spans.append(Span.from_dict(row))
        except (KeyError, TypeError, ValueError):
            continue
    return chrome_trace(spans)


def profiler(files: RunFiles) -> dict[str, Any]:
    lines = files.profiler()
    return {"available": lines.present, "summaries": lines.rows}


def health(files: RunFiles) -> dict[str, Any]:
    lines = files.health()
    journal_keys = sorted({k for row in files.journal().rows for k in row if k.startswith("health/")})
    return {"available": lines.present, "verdicts": lines.rows, "journal_keys": journal_keys}


def _group_flags(samples: list[dict[str, Any]]) -> dict[Any, bool]:
    """group index -> every reward in it equal (zero std: GRPO learns nothing from the group)."""
    rewards: dict[Any, list[Any]] = defaultdict(list)
    for s in samples:
        rewards[s.get("group_index")].append(s.get("reward"))
    return {g: len(set(r)) == 1 for g, r in rewards.items()}


def turns_of(sample: dict[str, Any]) -> int:
    """Assistant turns of a multi-turn trajectory; 1 for a single-turn sample."""
    if isinstance(sample.get("num_turns"), int):
        return max(1, sample["num_turns"])
    messages = sample.get("messages")
    messages = messages if isinstance(messages, list) else []
    return max(1, sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant"))


def rollouts(files: RunFiles) -> dict[str, Any]:
    tokens = set(files.token_rollouts())
    out = []
    for rid in files.sample_rollouts():
        samples = files.samples(rid).rows
        rewards = [s["reward"] for s in samples if isinstance(s.get("reward"), (int, float))]
        flags = _group_flags(samples)
        out.append({"rollout_id": rid, "samples": len(samples), "has_tokens": rid in tokens,
                    "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                    "groups": len(flags), "zero_std_groups": sum(flags.values())})
    return {"rollouts": out}


@dataclass(frozen=True)
class SampleFilter:
    min_reward: float | None = None
    max_reward: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    truncated: bool | None = None
    min_turns: int | None = None
    max_turns: int | None = None
    zero_std: bool | None = None

    def keeps(self, s: dict[str, Any]) -> bool:
        reward, length = s.get("reward"), s.get("response_length") or 0
        checks = [
            self.min_reward is None or (reward is not None and reward >= self.min_reward),
            self.max_reward is None or (reward is not None and reward <= self.max_reward),
            self.min_length is None or length >= self.min_length,
            self.max_length is None or length <= self.max_length,
            self.truncated is None or (s.get("status") == "truncated") == self.truncated,
            self.min_turns is None or s["turns"] >= self.min_turns,
            self.max_turns is None or s["turns"] <= self.max_turns,
            self.zero_std is None or s["zero_std"] == self.zero_std,
        ]
        return all(checks)


def rollout_samples(files: RunFiles, rollout_id: int, keep: SampleFilter = SampleFilter()) -> dict[str, Any]:
    lines = files.samples(rollout_id)
    if not lines.present:
        raise NotFound(f"rollout {rollout_id} has no sample table (logged every --log-samples-interval rollouts)")
    flags = _group_flags(lines.rows)
    has_tokens = files.tokens(rollout_id).present
    rows = []
    for position, s in enumerate(lines.rows):
        row = {**s, "index": s.get("index", position), "zero_std": flags[s.get("group_index")],
               "turns": turns_of(s), "truncated": s.get("status") == "truncated", "has_tokens": has_tokens}
        if keep.keeps(row):
            rows.append(row)
    return {"rollout_id": rollout_id, "total": len(lines.rows), "samples": rows}


def sample_detail(files: RunFiles, rollout_id: int, index: int) -> dict[str, Any]:
    table = rollout_samples(files, rollout_id)
    sample = next((s for s in table["samples"] if s["index"] == index), None)
    if sample is None:
        raise NotFound(f"rollout {rollout_id} has no sample {index}")
    tokens = next((t for t in files.tokens(rollout_id).rows if t.get("index") == index), None)
    return {"rollout_id": rollout_id, "sample": sample, "tokens": tokens,
            "tokens_note": None if tokens else f"{NOT_AVAILABLE}: no per-token file for rollout {rollout_id}",
            "messages": sample.get("messages")}


def summary(files: RunFiles) -> dict[str, Any]:
    """The run's headline numbers for the top of the Metrics view (first-hour N9)."""
    journal = files.journal().rows
    config = files.config()
    last = max((row.get("rollout_id", -1) for row in journal), default=None)
    num_rollout = num_rollout_of(config)
    return run_headline(files.run_dir, run_state(files.run_dir, last, num_rollout), num_rollout)


def evals(files: RunFiles, step: int | None = None) -> dict[str, Any]:
    """The per-prompt eval results (`samples/eval/`): which held-out prompts the model fails at an eval step
    (default the last), worst first (first-hour N12)."""
    try:
        by_step = read_eval_prompts(files.run_dir)
    except (OSError, ValueError):
        by_step = {}
    steps = sorted(by_step)
    if not steps:
        return {"available": False, "steps": [], "step": None, "prompts": []}
    if step is None:
        step = steps[-1]
    if step not in by_step:
        raise NotFound(f"no per-prompt eval results at eval step {step} (steps: {', '.join(map(str, steps))})")
    rows = sorted(by_step[step], key=lambda r: (r["pass_rate"], r["eval_set"], str(r["prompt"])))
    sets: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        sets[r["eval_set"]].append(r["pass_rate"])
    return {"available": True, "steps": steps, "step": step, "prompts": rows,
            "sets": {name: {"prompts": len(v), "mean_pass_rate": sum(v) / len(v),
                            "never_solved": sum(x == 0 for x in v)} for name, v in sets.items()}}
