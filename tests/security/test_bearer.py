"""The bearer header has one builder (`miles.serving.auth.bearer`), and the server side reads back what it builds."""
from __future__ import annotations

import re
from pathlib import Path

from miles.serving.auth import Unauthorized, bearer, check_token, given_token

ROOT = Path(__file__).resolve().parents[2]
BUILT_BY_HAND = re.compile(r"""f["']Bearer \{""")


def test_the_header_it_builds_is_the_one_the_servers_check():
    headers = {k.lower(): v for k, v in bearer("s3cret").items()}
    assert given_token(headers) == "s3cret"
    check_token(headers, "s3cret")
    try:
        check_token({k.lower(): v for k, v in bearer("other").items()}, "s3cret")
    except Unauthorized:
        pass
    else:
        raise AssertionError("a wrong token passed the check")


def test_no_token_sends_no_header():
    assert bearer(None) == {} and bearer("") == {}


def test_only_serving_auth_builds_the_header():
    """A second hand-built `f"Bearer {token}"` is how the seven copies came about: every client calls `bearer`."""
    builders = [f"{path.relative_to(ROOT)}:{n}" for folder in ("miles", "flows", "tasks", "benchmarks")
                for path in (ROOT / folder).rglob("*.py")
                for n, line in enumerate(path.read_text().splitlines(), 1) if BUILT_BY_HAND.search(line)]
    assert len(builders) == 1 and builders[0].startswith("miles/serving/auth.py:"), builders
