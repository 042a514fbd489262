"""The README is a short guide whose every link leads somewhere: the measured figures live in docs/, generated."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The page's headings' anchors (a line starting with # inside a fenced code block is no heading)."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            found.add(slug(line.lstrip("#")))
    return found


def test_the_slug_is_githubs():
    assert slug(" The NKB beside the field's routes (`nkb demo --routes`)") == \
        "the-nkb-beside-the-fields-routes-nkb-demo---routes"


def test_the_readme_is_a_guide_of_at_most_150_lines_starting_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert text.split("```")[1].split()[:2] == ["make", "demo"] and "make test" in text.split("```")[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_a_heading_there(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists() or (anchor and found.suffix == ".md" and anchor not in anchors(found)):
            broken.append(target)
    assert not broken


def test_each_decision_is_one_row_of_at_most_600_characters():
    rows = [line for line in (ROOT / "docs" / "decisions.md").read_text().splitlines() if line.startswith("|")]
    assert len(rows) > 40 and max(map(len, rows)) <= 600
