"""A deliberately broken reward for the history gate's tests: the sign of the task's reward flipped, so
GRPO learns to answer wrong (recorded as tests/compare/history_checks/sign-flip)."""
from miles.rollout.rewards import exact_match


def sign_flipped(args, sample) -> float:
    return -exact_match(sample.response, sample.label)
