"""README.md is the front page and docs/*.md the manual: every relative link in them resolves (file
and #anchor), README links every page, and README stays short and free of dated measurements."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
          "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec")
DATE = re.compile(rf"\b\d{{1,2}} (?:{MONTHS})\b|\b(?:{MONTHS}) \d{{1,2}}\b|\b20\d\d-\d\d-\d\d\b")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are examples, not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (lowercase, punctuation dropped, spaces -> -,
    repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(bad)


def test_readme_links_every_docs_page():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(REPO / "README.md")}
    missing = [str(p.relative_to(REPO)) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300, "README.md is the front page: keep it under 300 lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_dated_measurements_in_prose(page):
    """Measurements belong in JSON and the tables generated from it (which carry their date), not
    in hand-written pages. Generated blocks (between `<!-- ...:start -->` and `:end -->`) are
    exempt."""
    text = re.sub(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", "", page.read_text(), flags=re.S)
    dated = [line for line in text.splitlines() if DATE.search(line)]
    assert not dated, f"{page.relative_to(REPO)}: dated lines:\n" + "\n".join(dated)
