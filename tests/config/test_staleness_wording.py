"""Review N34: the refusal of uncorrected async training said "(1 versions stale)"."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, parse_config


@pytest.mark.parametrize("k, words", [("1", "(1 version stale)"), ("3", "(3 versions stale)")])
def test_the_refusal_counts_versions_in_words(k, words):
    with pytest.raises(ConfigError) as refused:
        parse_config(["--max-weight-staleness", k])
    assert words in str(refused.value)
