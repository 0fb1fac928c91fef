"""Deliberately broken custom rewards for the health watch's calibration runs and tests."""


def always_one(args, sample) -> float:
    """Rewards every answer: the reward saturates at 1 (the `raw_reward` red flag)."""
    return 1.0


def huge(args, sample) -> float:
    """A finite reward so large that the mean of a few overflows to infinity (probe C8b)."""
    return 1e308
