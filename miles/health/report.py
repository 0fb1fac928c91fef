"""The run report: one PNG of the "What to watch" signals, with the page's red-flag lines."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles.record import layout
from miles.record.journal import JournalLine
from miles.record.names import step_key

REPORT_NAME = layout.REPORT


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]
    hline: float | None = None  # a threshold from the "What to watch" table
    hline_label: str = ""
    signal: str = ""  # the health watch's signal: its red flags are marked on the panel


def panels(clip_grad: float) -> list[Panel]:
    return [
        Panel("loss", ("train/loss",), signal="loss"),
        Panel("raw_reward", ("rollout/raw_reward",), signal="raw_reward"),
        Panel("kl_loss (--use-kl-loss)", ("train/kl_loss",), signal="kl_loss"),
        Panel("train_rollout_logprob_abs_diff", ("train/train_rollout_logprob_abs_diff",),
              signal="train_rollout_logprob_abs_diff"),
        Panel("entropy_loss", ("train/entropy_loss",), signal="entropy_loss"),
        Panel("grad_norm", ("train/grad_norm",), clip_grad, f"clip_grad={clip_grad:g}", signal="grad_norm"),
        Panel("rollout_time vs train_time (s)", ("perf/rollout_time", "perf/train_time"),
              signal="rollout_train_time"),
        Panel("pg_clipfrac", ("train/pg_clipfrac",), 0.2, "0.2 (healthy below)", signal="pg_clipfrac"),
    ]


MULTI_TURN_PANEL = Panel("multi_turn: turns per trajectory, tool use",
                         ("multi_turn/round_number_mean", "multi_turn/tool_use_ratio"))


def eval_panel(lines: list[JournalLine]) -> Panel | None:
    """The headline result: every eval set's pass@k on eval/step (the base eval at 0, then each eval during
    training); None when the run evaluated nothing."""
    keys = sorted({k for ln in lines for k in ln.metrics if k.startswith("eval/") and "-pass_at_" in k})
    if not keys:
        return None
    ys = series(lines, keys[0])[1]  # the first set's pass@1 (sorted: pass_at_1 before pass_at_2) in the title
    headline = f": {keys[0].split('/', 1)[1]} {ys[0]:.3f} -> {ys[-1]:.3f}" if len(ys) > 1 else ""
    return Panel(f"held-out eval pass@k{headline}", tuple(keys))


def staleness_panel(lines: list[JournalLine]) -> Panel | None:
    """An async run's mean raw reward by how many weight versions stale its samples were
    (`rollout/reward_by_staleness/<k>`); None for a synchronous run."""
    keys = sorted({k for ln in lines for k in ln.metrics if k.startswith("rollout/reward_by_staleness/")},
                  key=lambda k: int(k.rsplit("/", 1)[1]) if k.rsplit("/", 1)[1].isdigit() else 0)
    return Panel("async: raw reward by staleness (weight versions)", tuple(keys)) if keys else None


def series(lines: list[JournalLine], key: str) -> tuple[list[float], list[float]]:
    points = [(ln.metrics.get(step_key(key), ln.rollout_id), ln.metrics[key]) for ln in lines if key in ln.metrics]
    return [p[0] for p in points], [p[1] for p in points]


def red_flag_rollouts(lines: list[JournalLine], signal: str) -> list[int]:
    """Rollouts on which the health watch raised `signal`'s red flag (`health/<signal>` = 1)."""
    key = f"health/{signal}"
    return sorted({ln.rollout_id for ln in lines if ln.metrics.get(key, 0.0) >= 1.0})


def write_report(lines: list[JournalLine], path: Path, clip_grad: float = 1.0, title: str = "") -> Path:
    report_figure(lines, clip_grad, title).savefig(path, dpi=80)
    return path


def report_figure(lines: list[JournalLine], clip_grad: float = 1.0, title: str = ""):
    """The report as a matplotlib Figure (not drawn on any display)."""
    import matplotlib

    matplotlib.use("Agg")  # no display; also safe off the main thread
    from matplotlib.figure import Figure

    shown = panels(clip_grad)
    evals = eval_panel(lines)
    if evals is not None:  # the result first, then what to watch
        shown.insert(0, evals)
    if any(MULTI_TURN_PANEL.keys[0] in ln.metrics for ln in lines):  # a multi-turn run: its turn count too
        shown.append(MULTI_TURN_PANEL)
    stale = staleness_panel(lines)
    if stale is not None:  # an async run: its reward by staleness
        shown.append(stale)
    columns = 4 if len(shown) <= 8 else 5
    rows = -(-len(shown) // columns)
    fig = Figure(figsize=(4 * columns, 4 * rows), constrained_layout=True)
    axes = fig.subplots(rows, columns).flatten()
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    for ax, panel in zip(axes, shown):
        ax.set_title(panel.title, fontsize=10)
        plotted = False
        for key in panel.keys:
            xs, ys = series(lines, key)
            if xs:
                ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=key)
                ax.set_xlabel(step_key(key))
                plotted = True
        if not plotted:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_xticks([])
            ax.set_yticks([])  # no made-up 0-1 axis
            continue
        if panel.hline is not None:
            ax.axhline(panel.hline, color="red", linestyle="--", linewidth=1, label=panel.hline_label)
        flagged = red_flag_rollouts(lines, panel.signal) if panel.signal else []
        if flagged:  # red flags on the rollout axis (train/* panels: their last train step of the rollout)
            axis = step_key(panel.keys[0])
            steps = {ln.rollout_id: ln.metrics[axis] for ln in lines if axis in ln.metrics}
            for rollout_id in flagged:
                x = steps.get(rollout_id)
                ax.axvline(rollout_id if x is None else x, color="red", alpha=0.25, linewidth=3)
            ax.set_title(f"{panel.title}: RED FLAG from rollout {flagged[0]}", fontsize=10, color="red")
        ax.legend(fontsize=7)
    others = [s for s in ("stall", "router_errors", "truncated_ratio", "straggler",
                          "router_collapse")
              if red_flag_rollouts(lines, s)]
    fig.suptitle((title or "What to watch") + (f"  (red flags: {', '.join(others)})" if others else ""))
    return fig
