"""The DLRM example's training speed on a busy machine: its samples/s alone and beside ``--busy`` processes
that keep a core busy each, with OpenMP's and PyTorch's own thread settings (``before``) and with
fae_torchrec's (``after``: idle OpenMP threads spin about 0.1 ms, not 3 ms, before they sleep; intra-op
threads from the cores the process may use, less those other processes keep busy when it starts;
``fae_torchrec/threads.py``).

``before`` is what the example ran with until fae_torchrec set its own: libgomp's spin before an idle thread
sleeps when no wait policy is set (``GOMP_SPINCOUNT=300000``, about 3 ms) and PyTorch's default intra-op
threads (one a physical core). ``after`` is a plain run: the example chooses. Every run is a fresh
``python examples/train_dlrm_fae.py --num-samples N`` (``samples_per_second`` of its ``metrics.json``:
training steps only). Each round runs every (setting, machine) pair once, in an order that rotates from
round to round; the figure of a pair is its median over the rounds.

    python benchmarks/bench_busy.py                        # 40,000 inputs, 2 busy processes, 3 rounds
    python benchmarks/bench_busy.py --rounds 5 --busy 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.example_runs import run_example
from benchmarks.common.statistics import standard_error
from fae_torchrec.arguments import non_negative_int, positive_int
from fae_torchrec.threads import WAIT_VARIABLES

#: libgomp's spins before an idle thread sleeps when no wait policy is set (its ``env.c``).
GOMP_DEFAULT_SPINS = 300_000
SETTINGS = ("before", "after")
MACHINES = ("idle", "busy")
#: A process that keeps one core busy until it is killed.
SPINNER = [sys.executable, "-c", "while True: pass"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=positive_int, default=40_000, help="the example's inputs")
    parser.add_argument("--busy", type=non_negative_int, default=2, help="busy processes beside a busy run")
    parser.add_argument("--rounds", type=positive_int, default=3, help="runs of each pair")
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--out", help="bench_busy.json goes here (default: a temporary folder)")
    return parser.parse_args(argv)


def child_env(setting: str, default_threads: int) -> dict[str, str]:
    """The example's environment for ``setting``: none of the thread variables the caller (or pytest) may
    have set, and for ``before`` OpenMP's and PyTorch's defaults, made explicit."""
    env = {k: v for k, v in os.environ.items() if k not in (*WAIT_VARIABLES, "OMP_NUM_THREADS")}
    if setting == "before":
        env |= {"GOMP_SPINCOUNT": str(GOMP_DEFAULT_SPINS), "OMP_NUM_THREADS": str(default_threads)}
    return env


def torch_default_threads() -> int:
    """PyTorch's own intra-op threads here (a fresh process, no thread variable set)."""
    env = child_env("after", 0)
    code = "import torch; print(torch.get_num_threads())"
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout)  # fmt: skip


def measure(args: argparse.Namespace, setting: str, machine: str, out: Path, threads: int) -> float:
    """samples/s of one run of the example with ``setting``, alone or beside ``--busy`` spinners."""
    spinners = [subprocess.Popen(SPINNER) for _ in range(args.busy if machine == "busy" else 0)]
    try:
        metrics = run_example(["--num-samples", str(args.num_samples)], out, env=child_env(setting, threads))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return float(metrics["samples_per_second"])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_busy-"))
    threads = torch_default_threads()
    pairs = [(setting, machine) for setting in args.settings for machine in MACHINES]
    runs: dict[str, list[float]] = {f"{s}/{m}": [] for s, m in pairs}
    for round_index in range(args.rounds):
        shift = round_index % len(pairs)
        for setting, machine in pairs[shift:] + pairs[:shift]:
            speed = measure(args, setting, machine, out / "run", threads)
            runs[f"{setting}/{machine}"].append(speed)
            print(f"round {round_index + 1}: {setting:6} {machine:4} {speed:9.0f} samples/s", flush=True)
    median = {pair: statistics.median(speeds) for pair, speeds in runs.items()}
    print(
        f"\nDLRM example, --num-samples {args.num_samples}, {os.cpu_count()} cores, {args.busy} busy "
        f"processes beside a busy run; samples/s, median [lowest, highest] of {args.rounds} rounds"
    )
    print(f"{'setting':8} {'idle':>23} {'busy':>23} {'busy/idle':>10}")
    for setting in args.settings:
        speeds = [runs[f"{setting}/{machine}"] for machine in MACHINES]
        cells = [f"{statistics.median(s):7.0f} [{min(s):6.0f}, {max(s):6.0f}]" for s in speeds]
        ratio = median[f"{setting}/busy"] / median[f"{setting}/idle"]
        print(f"{setting:8} {cells[0]:>23} {cells[1]:>23} {ratio:10.3f}")
    if set(SETTINGS) <= set(args.settings):
        for machine in MACHINES:  # paired by round: the same moment's load on both
            ratios = np.array(runs[f"after/{machine}"]) / np.array(runs[f"before/{machine}"])
            print(
                f"after/before, {machine}: {float(ratios.mean()):.2f}x (SE {standard_error(ratios):.2f}, "
                f"paired by round; {int((ratios < 1).sum())} of {len(ratios)} rounds below 1)"
            )
    result = {"num_samples": args.num_samples, "busy": args.busy, "torch_default_threads": threads,
              "runs": runs, "median": median}  # fmt: skip
    (out / "bench_busy.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'bench_busy.json'}")
    return result


if __name__ == "__main__":
    main()
