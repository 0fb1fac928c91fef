"""The truncated-importance-sampling flags checked together (probe AS5): `--tis-clip 0` made every token's
TIS weight min(ratio, 0) = 0, no policy gradient at all, and a TIS clip without `--use-tis` did nothing,
both without a word."""
from __future__ import annotations

from miles.config.fields import ConfigError

DEFAULT_CLIP, DEFAULT_CLIP_LOW = 2.0, 0.0  # TrainConfig's defaults: a clip left at them was not given


def check_tis_flags(train) -> None:
    """ConfigError for a TIS clip that zeroes every weight, or TIS clips given without --use-tis."""
    if train.use_tis and train.tis_clip <= 0:
        raise ConfigError("--tis-clip", f"must be above 0 with --use-tis, got {train.tis_clip}: every token's TIS "
                                        f"weight is at most the clip, so 0 leaves no policy gradient")
    if not train.use_tis:
        for flag, value, default in (("--tis-clip", train.tis_clip, DEFAULT_CLIP),
                                     ("--tis-clip-low", train.tis_clip_low, DEFAULT_CLIP_LOW)):
            if value != default:
                raise ConfigError(flag, f"{value} is given without --use-tis, where it does nothing; add --use-tis "
                                        f"or leave it out")
