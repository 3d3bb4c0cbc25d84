"""BENCHMARKS.md opens with its one-page summary, its figures moved out keep their commands, and every
link to a page's section, in the README, BENCHMARKS.md and docs/, names a heading that exists."""

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
PAGES = [ROOT / "README.md", BENCHMARKS, *sorted((ROOT / "docs").glob("*.md"))]
SCREEN = 40  # lines: the summary must fit the first screen


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (code blocks left out): lower case, punctuation dropped,
    spaces to hyphens, a repeated heading numbered from -1."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    seen: Counter = Counter()
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def test_the_summary_is_the_first_screen_and_each_line_says_what_how_which_command_and_where():
    lines = BENCHMARKS.read_text().splitlines()
    assert lines[0] == "# Benchmarks"
    start = lines.index("## Summary")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert end <= SCREEN, f"the summary ends at line {end}, past the first screen ({SCREEN} lines)"
    rows = [line for line in lines[start:end] if line.startswith("| ") and not line.startswith("| figure")]
    assert len(rows) >= 10
    anchors = _anchors(BENCHMARKS)
    for row in rows:
        figure, kind, command, section = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert re.search(r"\d", figure) or kind == "not run", row
        assert re.match(r"(measured|predicted|not run)", kind), row
        assert "`" in command and ".py" in command, row
        links = re.findall(r"\]\(#([^)]+)\)", section)
        assert links and set(links) <= anchors, row


def test_the_moved_outputs_open_with_their_command_and_the_page_links_them():
    linked = set(re.findall(r"\]\((benchmarks/results/[^)]+\.txt)\)", BENCHMARKS.read_text()))
    files = {str(path.relative_to(ROOT)) for path in (ROOT / "benchmarks" / "results").glob("*.txt")}
    assert files and linked == files
    for name in files:
        header = (ROOT / name).read_text().split("\n\n")[0]
        assert header.startswith("$ ") and "python benchmarks/bench_" in header, name


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_to_sections_name_headings_that_exist(page):
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)#([^)\s]+)\)", page.read_text()):
        linked = (page.parent / target).resolve() if target else page
        if not linked.is_file() or anchor not in _anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert broken == []
