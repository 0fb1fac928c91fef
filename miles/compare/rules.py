"""Which metrics a comparison judges and how: one one-sided rule per metric (the direction that is worse,
a relative and an absolute tolerance, a k-sigma band, optional absolute bounds, how many steps of a
stretch must be outside for a regression, and whether it is a timing: a slower machine is not a broken run, so
timing verdicts are reported apart and fail a comparison only when asked to, `--gate-timing`).

The defaults follow Miles' CI metric-history gate (grad_norm may rise 50% or 0.1, raw_reward fall 20% or
0.05) and extend it to the rest of the "What to watch" signals, eval pass@k and the perf/ times. A
history directory or `--rules FILE` may replace them with a JSON file `{"rules": [{...}, ...]}`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from miles.config import ConfigError

UP, DOWN = "up", "down"  # the direction in which a metric gets worse
SUSTAIN = 3  # by default 3 of 5 steps outside are a regression on the rollout and train axes
FLOOR_SHARE = 0.2  # a falling metric below a fifth of its positive baselines' mean is never noise


@dataclass(frozen=True)
class Rule:
    pattern: str  # a metric key, or a shell pattern of keys (fnmatch: `perf/*_time`)
    worse: str  # UP: a value above the corridor is a regression; DOWN: below it
    rel: float  # tolerance as a share of the baselines' mean at that step
    abs: float  # tolerance in the metric's unit (the floor where the mean is near 0)
    k_sigma: float = 3.0  # the band widens to k standard deviations of the baselines at that step
    min: float | None = None  # absolute bounds, judged at every step, with or without baselines
    max: float | None = None
    # k: outside at k of 2k-1 judged steps in a stretch is a regression (None: 1 on the eval axis, whose points
    # are each the mean of hundreds of samples, SUSTAIN elsewhere); one step past three
    # tolerances is one too
    sustain: int | None = None
    timing: bool | None = None  # a timing (None: under perf/ or straggler/): reported apart, gated on request

    def steps_needed(self, axis: str) -> int:
        return self.sustain if self.sustain is not None else (1 if axis == "eval/step" else SUSTAIN)

    @property
    def is_timing(self) -> bool:
        if self.timing is not None:
            return self.timing
        return self.pattern.startswith(("perf/", "straggler/"))

    def tolerance(self, mean: float, std: float) -> float:
        """How far past the baselines' mean a value may go in the worse direction. Falling, the noise and
        the absolute floor may take a positive mean down to FLOOR_SHARE of itself, never to zero or below
        (issue 55, N29: an entropy collapsing late read "within" under a bound below zero); `rel` is the
        rule's own word and is not capped."""
        widest = max(self.abs, self.k_sigma * std)
        if self.worse == DOWN and mean > 0:
            widest = min(widest, (1 - FLOOR_SHARE) * mean)
        return max(self.rel * abs(mean), widest)

    def bound(self, mean: float, std: float) -> float:
        """The worst value still inside the corridor."""
        tol = self.tolerance(mean, std)
        return mean + tol if self.worse == UP else mean - tol

    def outside(self, value: float, bound: float) -> bool:
        return value > bound if self.worse == UP else value < bound

    def out_of_bounds(self, value: float) -> str | None:
        if self.min is not None and value < self.min:
            return f"below the absolute bound {self.min:g}"
        if self.max is not None and value > self.max:
            return f"above the absolute bound {self.max:g}"
        return None


DEFAULT_RULES: tuple[Rule, ...] = (
    # Miles' CI rules
    Rule("rollout/raw_reward", DOWN, rel=0.2, abs=0.05),
    Rule("train/grad_norm", UP, rel=0.5, abs=0.1),
    # the other "What to watch" signals, each in the direction of its red flag
    Rule("train/loss", UP, rel=0.5, abs=0.1),
    Rule("train/kl_loss", UP, rel=1.0, abs=0.01),
    Rule("train/train_rollout_logprob_abs_diff", UP, rel=1.0, abs=0.01, max=0.5),
    Rule("train/entropy_loss", DOWN, rel=0.5, abs=0.1),
    Rule("train/pg_clipfrac", UP, rel=1.0, abs=0.05, max=0.5),
    Rule("rollout/truncated_ratio", UP, rel=1.0, abs=0.1),
    # eval: pass@k of every eval set may fall as far as the reward
    Rule("eval/*-pass_at_*", DOWN, rel=0.2, abs=0.05),
    # perf/: a phase 50% (and a second) slower than the baselines
    Rule("perf/*_time", UP, rel=0.5, abs=1.0),
)
# Rules a file may hold: each key a comparison meets is matched against the rules in order, on every line,
# so time grows with their number (50,000 rules stalled compare and the history gate for minutes, CR3);
# a real file has a few dozen
MAX_RULES = 1000
FIELDS = {"pattern": str, "worse": str, "rel": float, "abs": float, "k_sigma": float, "min": float, "max": float,
          "sustain": int, "timing": bool}


def rule_for(key: str, rules: tuple[Rule, ...]) -> Rule | None:
    """The first rule whose pattern matches the key (None: the key is not compared)."""
    return next((r for r in rules if fnmatchcase(key, r.pattern)), None)


def rules_as_json(rules: tuple[Rule, ...]) -> dict:
    return {"rules": [{k: v for k, v in asdict(r).items() if v is not None} for r in rules]}


def parse_rules(raw: object, where: str) -> tuple[Rule, ...]:
    """Rules from their JSON form; ConfigError naming `where` and the field when one is wrong."""
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list) or not raw["rules"]:
        raise ConfigError(where, 'not a JSON object {"rules": [...]} with at least one rule')
    if len(raw["rules"]) > MAX_RULES:
        raise ConfigError(where, f"{len(raw['rules'])} rules; at most {MAX_RULES} (a pattern like `perf/*_time` "
                                 f"covers many keys in one rule)")
    rules = []
    for i, item in enumerate(raw["rules"]):
        if not isinstance(item, dict):
            raise ConfigError(where, f"rules[{i}] is not an object")
        unknown = set(item) - set(FIELDS)
        if unknown:
            raise ConfigError(where, f"rules[{i}]: unknown field {sorted(unknown)[0]!r} (fields: {', '.join(FIELDS)})")
        for name in ("pattern", "worse", "rel", "abs"):
            if name not in item:
                raise ConfigError(where, f"rules[{i}]: {name} is required")
        values = {}
        for name, value in item.items():
            kind = FIELDS[name]
            if kind is str and not isinstance(value, str):
                raise ConfigError(where, f"rules[{i}].{name}: {value!r:.40} is not a string")
            if kind is bool and not isinstance(value, bool):
                raise ConfigError(where, f"rules[{i}].{name}: {value!r:.40} is not true or false")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000):
                raise ConfigError(where, f"rules[{i}].{name}: {value!r:.40} is not a whole number of steps 1-1000")
            if kind is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ConfigError(where, f"rules[{i}].{name}: {value!r:.40} is not a finite number")
                if name in ("rel", "abs", "k_sigma") and value < 0:
                    raise ConfigError(where, f"rules[{i}].{name}: {value} is negative")
                value = float(value)
            values[name] = value
        if values["worse"] not in (UP, DOWN):
            raise ConfigError(where, f"rules[{i}].worse: {values['worse']!r} is neither {UP!r} nor {DOWN!r}")
        rules.append(Rule(**values))
    return tuple(rules)


def load_rules(path: Path, where: str) -> tuple[Rule, ...]:
    try:
        raw = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise ConfigError(where, f"{path} does not exist") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(where, f"cannot read {path} as JSON: {' '.join(str(exc).split())[:200]}") from None
    return parse_rules(raw, where)
