"""How long ``--help`` takes: ``fae-torchrec --help`` (and its commands') and the examples' ``--help``, each
in a fresh Python process, as a user types them; the median of ``--runs`` runs, wall seconds.

What keeps them quick is that building a parser imports neither torch nor TorchRec
(``fae_torchrec.command_line``); a command imports them when it runs.

    python benchmarks/bench_cli.py               # 5 runs each
    python benchmarks/bench_cli.py --runs 1      # the smoke test's
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Each timed command line: its name in the table and its arguments to ``python``.
COMMANDS = {
    "fae-torchrec --help": ["-m", "fae_torchrec.cli", "--help"],
    "fae-torchrec profile --help": ["-m", "fae_torchrec.cli", "profile", "--help"],
    "fae-torchrec plan --help": ["-m", "fae_torchrec.cli", "plan", "--help"],
    "examples/train_dlrm_fae.py --help": [str(ROOT / "examples" / "train_dlrm_fae.py"), "--help"],
    "examples/train_tbsm_fae.py --help": [str(ROOT / "examples" / "train_tbsm_fae.py"), "--help"],
    # what a command costs before its work once it runs: Python, torch and TorchRec loaded
    "python -c 'import torchrec' (reference)": ["-c", "import torchrec"],
}


def wall_seconds(arguments: list[str]) -> float:
    """Wall seconds of ``python arguments`` in a fresh process, from start to exit."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command; the median is shown")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be at least 1")
    width = max(map(len, COMMANDS))
    print(f"{'command':<{width}}  median s  min s  (wall, {args.runs} run(s) each, fresh processes)")
    for name, arguments in COMMANDS.items():
        seconds = [wall_seconds(arguments) for _ in range(args.runs)]
        print(f"{name:<{width}}  {statistics.median(seconds):8.2f}  {min(seconds):5.2f}")


if __name__ == "__main__":
    main()
