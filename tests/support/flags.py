"""The flag lists of the short runs the tests start: one small shape and its named variants (what
each changes, and why)."""

# Plain runs (`python -m miles.train`): small enough to run in seconds on 2 busy cores, big enough
# for GRPO groups and two ranks.
SHAPE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "8"]
EVAL = ["--eval-max-prompts", "8", "--n-samples-per-eval-prompt", "2", "--eval-interval", "2"]
SMALL = [*SHAPE, "--num-rollout", "4", *EVAL, "--lr", "1e-3"]

# The live-tracking run (tracking/test_live.py): one rollout more to watch arrive, the default LR.
LIVE = [*SHAPE, "--num-rollout", "5", *EVAL]

# The runs diagnose holds in a reward (diagnose/hanging_runs.py): the smallest GRPO groups, rollouts
# enough never to end on their own, no eval, stall thresholds low enough to fire in seconds.
HANGING = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "40",
           "--micro-batch-size", "4", "--eval-interval", "none", "--lr", "1e-4",
           "--health-stall-factor", "3", "--health-stall-min-s", "4",
           "--health-stall-check-interval", "1"]

# The default run (100 rollouts; training/test_learning.py) on two ranks, with the history gate's
# evals (every 4 rollouts, on 64 prompts): its first 8 rollouts are what
# tests/compare/history/default-short judges. The trusted records there are runs of GATE_RECORD:
# those 8 rollouts alone, with the 100-rollout run's learning-rate schedule (cosine over 100
# optimizer steps, not 8).
DEFAULT_GATED = ["--actor-num-gpus-per-node", "2", "--eval-interval", "4",
                 "--eval-max-prompts", "64"]
GATE_RECORD = [*DEFAULT_GATED, "--num-rollout", "8", "--lr-decay-iters", "100"]

# Flow runs (`grpo`): two chunks of two rollouts, no eval, retries without delay.
FLOW = ["--num-rollout", "4", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
        "--chunk-size", "2", "--eval-interval", "none", "--task-retry-delay", "0"]
