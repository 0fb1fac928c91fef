"""Train-vs-rollout mismatch beyond one mean: Schulman's k1, k2 and k3 estimates of
KL(rollout || train), the importance ratio's tail and where in the response the mismatch sits.

With r = p_train / p_rollout per response token (from the log-probs; the tokens were sampled by
the rollout policy): k1 = -log r (unbiased, a sample's mean can be negative), k2 = (log r)^2 / 2,
k3 = (r - 1) - log r (>= 0, low variance). Each rank keeps *sums and counts* over its tokens
(`MismatchSums`); the driver adds the ranks up (`merge`) and divides once, so the figures are
token means over the whole rollout, not means of per-micro-batch or per-rank means. The ratio's
max is a max; its p99 comes from a fixed histogram of log r (`LOG_RATIO_EDGES`, 50 bins per
decade of |log r| from 1e-7 to 20: the reported p99 is the upper edge of the bin holding the
99th-percentile token, at most one bin (4.7% of log r) above the exact one, capped by the max).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

LOG_RATIO_CLAMP = 20.0  # as miles.backends.loss: no inf on a wild mismatch
_DECADES = torch.arange(-7.0, math.log10(LOG_RATIO_CLAMP) + 1e-9, 0.02, dtype=torch.float64)
LOG_RATIO_EDGES = torch.cat([-(10 ** _DECADES).flip(0), 10 ** _DECADES])  # bins (e[i-1], e[i]]
# response-token positions, bucketed in powers of two: [0, 4), [4, 8), ..., [4096, inf)
POSITION_EDGES = (0, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
P99 = 0.99
# |log r| below this is rounding (fp32 log-probs of the same weights differ by ~1e-6): its sign says
# nothing, so such a token does not count as pushing against its advantage
OPPOSED_MIN_LOG_RATIO = 1e-4
SUM_KEYS = ("k1", "k2", "k3", "abs_diff", "beyond_tis_clip", "adv_opposed")


def position_bucket_names() -> list[str]:
    """`lo-hi` of each position bucket (the last one `4096-inf`): metric-name safe everywhere."""
    highs = [str(e) for e in POSITION_EDGES[1:]] + ["inf"]
    return [f"{lo}-{hi}" for lo, hi in zip(POSITION_EDGES, highs)]


@dataclass
class MismatchSums:
    """One rank's (or, merged, the rollout's) token sums; plain Python, sent back through Ray."""

    tokens: float = 0.0
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUM_KEYS, 0.0))
    ratio_max: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * (len(LOG_RATIO_EDGES) + 1))
    position_tokens: list[float] = field(default_factory=lambda: [0.0] * len(POSITION_EDGES))
    position_k3: list[float] = field(default_factory=lambda: [0.0] * len(POSITION_EDGES))
    position_abs_diff: list[float] = field(default_factory=lambda: [0.0] * len(POSITION_EDGES))


def merge(parts: list[MismatchSums | None]) -> MismatchSums:
    """Ranks' sums added up (counts and sums add, the max is a max, histograms add bin by bin)."""
    out = MismatchSums()
    for p in (p for p in parts if p is not None):
        out.tokens += p.tokens
        for k in SUM_KEYS:
            out.sums[k] += p.sums[k]
        out.ratio_max = max(out.ratio_max, p.ratio_max)
        out.histogram = [a + b for a, b in zip(out.histogram, p.histogram)]
        for name in ("position_tokens", "position_k3", "position_abs_diff"):
            setattr(out, name, [a + b for a, b in zip(getattr(out, name), getattr(p, name))])
    return out


def ratio_p99(s: MismatchSums) -> float:
    """Nearest-rank 99th percentile of r from the histogram (its bin's upper edge, max-capped)."""
    rank = math.ceil(P99 * s.tokens)
    seen = 0
    for i, count in enumerate(s.histogram):
        seen += count
        if seen >= rank:
            edge = float(LOG_RATIO_EDGES[i]) if i < len(LOG_RATIO_EDGES) else math.inf
            return min(math.exp(edge), s.ratio_max)
    return s.ratio_max


def metrics(s: MismatchSums) -> dict[str, float]:
    """The train/mismatch_* figures of merged sums ({} without response tokens)."""
    if s.tokens <= 0:
        return {}
    n = s.tokens
    out = {f"train/mismatch_{k}": s.sums[k] / n for k in ("k1", "k2", "k3")}
    out |= {"train/mismatch_ratio_p99": ratio_p99(s), "train/mismatch_ratio_max": s.ratio_max,
            "train/mismatch_ratio_beyond_tis_clip": s.sums["beyond_tis_clip"] / n,
            "train/mismatch_adv_opposed_frac": s.sums["adv_opposed"] / n}
    for name, count, k3, diff in zip(position_bucket_names(), s.position_tokens, s.position_k3,
                                     s.position_abs_diff):
        if count > 0:
            out[f"train/mismatch_pos/tokens/{name}"] = count / n
            out[f"train/mismatch_pos/k3/{name}"] = k3 / count
            out[f"train/mismatch_pos/abs_diff/{name}"] = diff / count
    return out


class MismatchTally:
    """A rank's running sums on its device over its micro-batches; `result` copies them out once."""

    def __init__(self, tis_low: float, tis_high: float, device: torch.device):
        self.low, self.high, self.device = tis_low, tis_high, device
        self.edges = LOG_RATIO_EDGES.to(device=device, dtype=torch.float32)
        self.pos_edges = torch.tensor(POSITION_EDGES[1:], device=device)
        self.sums = torch.zeros(len(SUM_KEYS) + 1, dtype=torch.float64, device=device)  # + tokens
        self.peak = torch.zeros((), dtype=torch.float64, device=device)
        self.hist = torch.zeros(len(self.edges) + 1, dtype=torch.long, device=device)
        self.by_pos = torch.zeros(3, len(POSITION_EDGES), dtype=torch.float64, device=device)

    @torch.no_grad()
    def add(self, train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor,
            advantages: torch.Tensor) -> None:
        """One micro-batch's (B, T) log-probs, response mask and per-token advantages."""
        on = mask > 0
        log_r = (train_lp - rollout_lp).float().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)[on]
        r = log_r.exp()
        k3 = (torch.expm1(log_r) - log_r).clamp(min=0.0)  # expm1: exact near r = 1
        beyond = (r > self.high) | (r < self.low)
        # sign(A) against sign(r - 1), past the float noise of a matched pair (else a coin flip)
        opposed = ((advantages[on] * log_r) < 0) & (log_r.abs() > OPPOSED_MIN_LOG_RATIO)
        # SUM_KEYS' order, then a 1 per token (the count): one reduction for all seven
        parts = torch.stack([-log_r, log_r ** 2 / 2, k3, log_r.abs(), beyond.float(),
                             opposed.float(), torch.ones_like(log_r)])
        self.sums += parts.double().sum(-1)
        if log_r.numel():
            self.peak = torch.maximum(self.peak, r.max().double())
        self.hist += torch.bincount(torch.bucketize(log_r, self.edges), minlength=len(self.hist))
        self._add_positions(on, parts[[6, 2, 3]])

    def _add_positions(self, on: torch.Tensor, values: torch.Tensor) -> None:
        """Add (3, N) token values (count, k3, |log r|) to the bucket of each token's place in its
        response (0 = the first token the model wrote)."""
        start = on.int().argmax(-1, keepdim=True)  # a response's first position
        cols = torch.arange(on.shape[-1], device=on.device).expand_as(on)
        bucket = torch.bucketize((cols - start)[on], self.pos_edges, right=True)
        self.by_pos.index_add_(1, bucket, values.double())

    def result(self) -> MismatchSums:
        sums = self.sums.tolist()
        by_pos = self.by_pos.tolist()
        return MismatchSums(sums[-1], dict(zip(SUM_KEYS, sums[:-1])), float(self.peak),
                            self.hist.tolist(), by_pos[0], by_pos[1], by_pos[2])
