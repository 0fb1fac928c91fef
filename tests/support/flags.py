"""The flag lists of the short runs the tests start, one per size, named for what they are for."""

# Plain runs (`python -m miles.train`): small enough to run in seconds on 2 busy cores, big enough for GRPO
# groups and two ranks.
SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "4",
         "--micro-batch-size", "8", "--eval-max-prompts", "8", "--n-samples-per-eval-prompt", "2",
         "--eval-interval", "2", "--lr", "1e-3"]

# Flow runs (`grpo`): two chunks of two rollouts, no eval, retries without delay.
FLOW = ["--num-rollout", "4", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--chunk-size", "2",
        "--eval-interval", "none", "--task-retry-delay", "0"]
