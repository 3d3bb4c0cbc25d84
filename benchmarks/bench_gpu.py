"""Training throughput of FAE against TorchRec's planners at capped HBM: one prepared run for a GPU.

Trains ``examples/train_dlrm_fae.py`` five times on the same built-in synthetic data, on the inputs the
profile did not sample (``--exclude-profiled``), and compares the example's wall-clock samples/s
(training steps only):

- FAE: hot rows in HBM, cold rows in UVM-cached tables (``FAEShardingPlanner``), at ``--hbm-cap``;
- FAE planned: the same hot rows, cold rows in host memory copied into slot tables by the epoch's slot
  plan (``--cold-tier planned``, issue 48), at ``--hbm-cap``;
- (a) ``torchrec``: TorchRec's default planner, at ``--hbm-cap``;
- (b) ``scaleup``: every table UVM-cached, caches grown by ``EmbeddingOffloadScaleupProposer``, at
  ``--hbm-cap``;
- (c) ``hbm``: every table in device memory, with the GPU's whole memory (the speed limit).

On a CUDA machine, build the virtual environment with the CUDA fbgemm (the Makefile picks it when
``nvidia-smi`` sees a GPU; ``make VARIANT=cuda .venv/.installed-cuda`` forces it), then::

    .venv/bin/python benchmarks/bench_gpu.py --hbm-cap 8GiB
    .venv/bin/python benchmarks/bench_gpu.py --hbm-cap 8GiB --world-size 2   # 2 GPUs, torchrun

Without CUDA it runs smaller (defaults shrink) so that CI keeps it working; there TorchRec plans its CPU
kernels for (a), (b) and (c) alike and ``--hbm-cap`` means nothing, which the output says.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.example_runs import run_example
from fae_torchrec.units import parse_bytes

#: The runs, in order, with the example's options of each: FAE with either cold tier, then the example's
#: ``--baseline`` choices (a), (b), (c).
MODES = {
    "fae": [],
    "planned": ["--cold-tier", "planned"],
    "torchrec": ["--baseline", "torchrec"],
    "scaleup": ["--baseline", "scaleup"],
    "hbm": ["--baseline", "hbm"],
}
FAE_MODES = ("fae", "planned")
LABELS = {
    "fae": "FAE",
    "planned": "FAE planned",
    "torchrec": "(a) torchrec",
    "scaleup": "(b) scaleup",
    "hbm": "(c) hbm",
}
#: Defaults with CUDA, and the smaller ones without (keys are the options' destinations).
CUDA_DEFAULTS = {"hbm_cap": "8GiB", "num_samples": 2_000_000, "scale": 1.0, "dim": 64, "batch_size": 4096}
CPU_DEFAULTS = {"hbm_cap": None, "num_samples": 100_000, "scale": 0.02, "dim": 16, "batch_size": 512}


def parse_args(argv: list[str] | None, cuda: bool) -> argparse.Namespace:
    defaults = CUDA_DEFAULTS if cuda else CPU_DEFAULTS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--hbm-cap", help=f"HBM per GPU for FAE (both tiers), (a) and (b) (default {defaults['hbm_cap']})"
    )
    parser.add_argument(
        "--num-samples", type=int, help=f"synthetic inputs (default {defaults['num_samples']:,})"
    )
    parser.add_argument(
        "--scale", type=float, help=f"table sizes = Criteo Kaggle's x scale ({defaults['scale']})"
    )
    parser.add_argument("--dim", type=int, help=f"embedding dimension (default {defaults['dim']})")
    parser.add_argument(
        "--batch-size", type=int, help=f"per-rank batch size (default {defaults['batch_size']})"
    )
    parser.add_argument("--budget", default="16MiB", help="FAE's hot-row budget")
    parser.add_argument("--world-size", type=int, default=1, help="ranks (GPUs); more than 1 runs torchrun")
    parser.add_argument("--out", default="runs/bench_gpu", help="the runs go here")
    args = parser.parse_args(argv)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.hbm_cap is not None:
        try:
            parse_bytes(args.hbm_cap)
        except ValueError as error:
            parser.error(f"--hbm-cap: {error}")
    if args.world_size < 1:
        parser.error(f"--world-size must be at least 1, got {args.world_size}")
    return args


def main(argv: list[str] | None = None) -> dict[str, dict | None]:
    cuda = torch.cuda.is_available()
    args = parse_args(argv, cuda)
    started = time.perf_counter()
    common = [
        "--num-samples", str(args.num_samples), "--scale", str(args.scale), "--dim", str(args.dim),
        "--batch-size", str(args.batch_size), "--budget", args.budget, "--exclude-profiled",
    ]  # fmt: skip
    if cuda and args.hbm_cap is not None:
        common += ["--hbm-cap", args.hbm_cap]
    print(
        f"data: {args.num_samples:,} synthetic inputs, scale {args.scale}, dim {args.dim}, batch "
        f"{args.batch_size} per rank, {args.world_size} rank(s), FAE budget {args.budget}"
    )
    if cuda:
        name = torch.cuda.get_device_name()
        print(f"device: {name}; HBM cap {args.hbm_cap} per GPU for FAE (both tiers), (a), (b)")
    else:
        print(
            "device: CPU (no CUDA): (b) scaleup and (c) hbm plan like (a), TorchRec's CPU kernels, and "
            "there is no HBM to cap; the figures only show that the runs work"
        )
    results: dict[str, dict | None] = {}
    errors: dict[str, str] = {}
    for mode, extra in MODES.items():
        try:
            results[mode] = run_example([*common, *extra], Path(args.out) / mode, args.world_size)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            results[mode] = None
            errors[mode] = str(error).splitlines()[-1]
    reference = results["torchrec"]
    print(f"{'mode':<14}{'samples/s':>12}{'vs (a)':>8}{'hot ms':>9}{'cold ms':>9}  plan kernels")
    for mode, metrics in results.items():
        if metrics is None:
            print(f"{LABELS[mode]:<14}  failed: {errors[mode]}")
            continue
        ratio = (
            f"{metrics['samples_per_second'] / reference['samples_per_second']:.2f}x" if reference else "-"
        )
        hot, cold = metrics["hot_step_ms"], metrics["cold_step_ms"]
        kernels = ", ".join(f"{n} {kernel}" for kernel, n in sorted(metrics["plan_kernels"].items()))
        print(
            f"{LABELS[mode]:<14}{metrics['samples_per_second']:>12,.0f}{ratio:>8}"
            f"{'-' if hot is None else f'{hot:.1f}':>9}{'-' if cold is None else f'{cold:.1f}':>9}  {kernels}"
        )
    for fae_mode in FAE_MODES:
        for mode in MODES:
            fae, other = results[fae_mode], results[mode]
            if mode not in FAE_MODES and fae is not None and other is not None:
                ratio = fae["samples_per_second"] / other["samples_per_second"]
                print(f"ratio {LABELS[fae_mode]} / {LABELS[mode]} samples/s: {ratio:.2f}x")
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    if errors:
        raise SystemExit(f"{len(errors)} run(s) failed: {', '.join(errors)}")
    return results


if __name__ == "__main__":
    main()
