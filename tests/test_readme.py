"""The Python examples of the README and of docs/ run as written, and the README stays a short page."""

import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _run_blocks(page: Path) -> dict:
    """Runs the page's ``python`` blocks in order, each continuing the previous ones as a reader
    runs them; their namespace."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)
    assert blocks, f"{page.name} has a Python example"
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), namespace)
    return namespace


def _topologies_from_the_factory(caplog) -> None:
    """TorchRec warns that a ``Topology`` built directly may fail the job; the examples use its factory."""
    assert not [r for r in caplog.records if "constructed directly" in r.getMessage()]


def test_readme_example_trains_a_model(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    namespace = _run_blocks(ROOT / "README.md")
    _topologies_from_the_factory(caplog)
    assert math.isfinite(namespace["loss"])
    kinds = namespace["kinds"]
    assert kinds["hot"] > 0 and kinds["cold"] > 0, kinds


def test_readme_is_short_and_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 8 * 1024
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert links and [link for link in links if not (ROOT / link).exists()] == []


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_docs_links_resolve(page):
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
    assert [link for link in links if not (page.parent / link).exists()] == []


@pytest.mark.parametrize(
    "page",
    [p for p in DOCS if "```python" in p.read_text()],
    ids=lambda p: p.name,
)
def test_docs_examples_run(page, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    _run_blocks(page)
    _topologies_from_the_factory(caplog)
