"""Every relative link and image of README.md and docs/ resolves: the file exists in the checkout and
an anchor names a heading of the page it points at (GitHub's heading ids). Pages named in the code
(printed hints, docstrings) exist too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import ROOT, doc_pages

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
COMMENT = re.compile(r"<!--.*?-->", re.S)


def prose(text: str) -> str:
    """The page without code blocks, inline code and comments, where a `[x](y)` is no link."""
    return INLINE_CODE.sub("", FENCE.sub("", COMMENT.sub("", text)))


def heading_ids(page: Path) -> set[str]:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces to '-', repeats numbered."""
    ids, seen = set(), {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked here


CASES = [(page, target) for page in doc_pages() for target in links(page)]


def test_the_docs_have_links_to_check():
    assert len(CASES) > 30


@pytest.mark.parametrize("page, target", CASES, ids=[f"{p.relative_to(ROOT)} -> {t}" for p, t in CASES])
def test_a_link_resolves(page: Path, target: str):
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    assert resolved.is_relative_to(ROOT), f"{target} points outside the checkout"
    assert resolved.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
    if anchor:
        assert resolved.suffix == ".md", f"{target}: an anchor into a file that is not a page"
        assert anchor in heading_ids(resolved), \
            f"{page.relative_to(ROOT)}: {target}: no such heading in {resolved.relative_to(ROOT)}"


def test_pages_named_in_the_code_exist():
    named = set()
    for folder in ("miles", "flows", "tasks"):
        for path in (ROOT / folder).rglob("*.py"):
            named |= {(path, m) for m in re.findall(r"\b(docs/[\w./-]+\.md)\b", path.read_text())}
    missing = [f"{path.relative_to(ROOT)}: {name}" for path, name in named if not (ROOT / name).is_file()]
    assert named and missing == []
