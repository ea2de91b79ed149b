"""Every relative link in the repository's Markdown (README, ARCHITECTURE, docs/, benchmarks/...) resolves
to a file inside the repository, and every #anchor to a heading of its target page (GitHub's slugs), so
the user docs cannot point outside the clone or at a page or section that moved."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folders that hold no docs of ours: virtual environments, builds, caches, fetched packages.
SKIP_PARTS = {"build", "node_modules", "__pycache__", "site-packages"}
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`]*`+")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files():
    return sorted(p for p in ROOT.rglob("*.md")
                  if not any(part.startswith(".") or part in SKIP_PARTS for part in p.relative_to(ROOT).parts))


def prose_lines(text, keep_code=False):
    """The lines outside fenced code blocks, with inline code spans removed (kept: for headings)."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line if keep_code else CODE_SPAN.sub("", line)


def links(text):
    for line in prose_lines(text):
        yield from INLINE_LINK.findall(line)
        m = REFERENCE_LINK.match(line)
        if m:
            yield m.group(1)


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(md):
    """(link, why) for each relative link of ``md`` that does not resolve inside the repository."""
    out = []
    for target in links(md.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (md.parent / unquote(path_part)).resolve() if path_part else md
        if dest != ROOT and ROOT not in dest.parents:
            out.append((target, "points outside the repository"))
        elif not dest.exists():
            out.append((target, f"{dest.relative_to(ROOT)} does not exist"))
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append((target, f"no heading #{anchor} in {dest.relative_to(ROOT)}"))
    return out


FILES = markdown_files()


def test_the_user_docs_are_checked():
    names = {str(p.relative_to(ROOT)) for p in FILES}
    assert {"README.md", "ARCHITECTURE.md", "docs/install.md"} <= names


@pytest.mark.parametrize("md", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    assert broken_links(md) == []


def test_the_checker_finds_broken_links(tmp_path, monkeypatch):
    """The rules themselves: outside the root, a missing file and a missing heading are caught;
    external links, code spans and fenced blocks are not links."""
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title\n\n## Use `it` (now)\n")
    page = tmp_path / "docs" / "b.md"
    page.write_text(
        "[ok](a.md) [ok](a.md#a-title) [ok](a.md#use-it-now) [ok](#b) [web](https://x.org/y)\n"
        "# B\n`[not a link](gone.md)`\n```\n[nor this](gone.md)\n```\n"
        "[out](../../etc/passwd) [gone](c.md) [bad anchor](a.md#nope)\n"
    )
    got = broken_links(page)
    assert [t for t, _ in got] == ["../../etc/passwd", "c.md", "a.md#nope"]
    assert "outside the repository" in got[0][1] and "does not exist" in got[1][1] and "no heading" in got[2][1]
