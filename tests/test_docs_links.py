"""README.md and docs/*.md: every relative link resolves, and the README stays a landing page.

A link `[text](path)` or `![alt](path)` must name an existing file or folder, relative to
the page; `path#anchor` (or `#anchor` on the same page) must also name a heading of that
page, by GitHub's rule: the heading's text, lowercased, punctuation dropped except `-`
and `_`, spaces turned into `-`, and `-1`, `-2`, ... added to repeats. Links to other
sites are not followed. Code (fenced blocks, `inline spans`) holds no links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
# Another project's commits a page must name to be reproduced (not ardiff's own history).
UPSTREAM_PINS = {"3ceb311"}   # SkyworkAI/Matrix-Game's released code (docs/matrix-game.md)


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a fenced line becomes empty)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's markdown text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = LINK.sub(lambda m: m.group(1), text)
    text = re.sub(r"[*~]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on the page."""
    found = []
    for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), 1):
        line = INLINE_CODE.sub(lambda m: "code", line)
        found.extend((number, match.group(2)) for match in LINK.finditer(line))
    return found


def problem(page: Path, target: str) -> str | None:
    """Why `target` (a link on `page`) does not resolve, or None when it does."""
    if SCHEME.match(target):
        return None  # another site
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.exists():
        return f"{path} does not exist"
    if anchor:
        if resolved.suffix != ".md" or resolved.is_dir():
            return f"#{anchor} points into {path}, which is not a markdown page"
        if anchor not in anchors(resolved):
            return f"{shown(resolved)} has no heading #{anchor}"
    return None


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    found = links(page)
    assert found, f"{page.name} has no links at all: is the link pattern broken?"
    broken = [f"line {number}: ({target}) {why}" for number, target in found
              if (why := problem(page, target))]
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_the_readme_is_a_landing_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; keep it a landing page of at most "
        f"{MAX_README_LINES} and move the detail to a page in docs/")


def test_the_readme_links_every_docs_page():
    linked = {(REPO / target.partition("#")[0]).resolve()
              for _, target in links(REPO / "README.md") if not SCHEME.match(target)}
    missing = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not missing, f"README.md links none of: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_no_page_names_a_commit(page):
    """Docs name dates and machines, not commits (a hash means nothing to a reader)."""
    hits = [f"line {number}: {match.group(0)}"
            for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            for match in COMMIT.finditer(line) if match.group(0) not in UPSTREAM_PINS]
    assert not hits, f"{page.relative_to(REPO)} names commits:\n" + "\n".join(hits)


@pytest.mark.parametrize("heading, expected", [
    ("3. What a block sees", "3-what-a-block-sees"),
    ("`ardiff rollout`", "ardiff-rollout"),
    ("Running Self-Forcing / CausVid / LongLive", "running-self-forcing--causvid--longlive"),
    ("The trained world model (the default video)", "the-trained-world-model-the-default-video"),
    ("Memory at 832×480, bfloat16", "memory-at-832480-bfloat16"),
    ("max_model_len and [links](x.md)", "max_model_len-and-links"),
])
def test_slugs_follow_githubs_rule(heading, expected):
    assert slug(heading) == expected


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\n```\n## not a heading\n```\n")
    assert problem(page, "#two-words") is None
    assert problem(page, "#title") is None
    assert problem(page, "#not-a-heading") == "page.md has no heading #not-a-heading"
    assert problem(page, "missing.md") == "missing.md does not exist"
    assert problem(page, "https://example.com/x") is None
