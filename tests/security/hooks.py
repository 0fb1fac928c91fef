"""Custom reward hooks a careless user might write (loaded by --custom-rm-path in the probes)."""


def rm_nan(args, sample):
    return float("nan")


def rm_text(args, sample):
    return "great"
