"""The README's Python example runs as written."""

import re
from pathlib import Path


def test_readme_example_runs(tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "README has a Python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:  # the blocks continue one another, as a reader runs them
        exec(compile(block, "README.md", "exec"), namespace)
    assert (tmp_path / "stats.npz").exists()
    assert set(namespace["plan"].plan) == {"hot", "cold"}
