"""Calibrate bench_traffic's step models on a CUDA GPU with FBGEMM: the effective host-device bandwidth for
scattered rows and the cache machinery's fixed cost per cache and step.

For each embedding dimension (``--dims``), one FBGEMM table-batched embedding (TBE) holds the 26 tables of
the built-in synthetic data at Kaggle sizes x ``--scale``, and a training step (forward, and backward with
FBGEMM's fused SGD) is timed with CUDA events on batches of ``--batch-size`` inputs of the stream
bench_traffic replays, in three placements:

- every row in HBM (``EmbeddingLocation.DEVICE``): ``hbm``;
- every row in UVM without a cache (``MANAGED``), a new batch every step: ``uvm``, whose rows move as
  FBGEMM's kernels move them (in at each lookup and once more for the backward, out once:
  ``cache_model.host_access``), so the effective bandwidth in the busier direction is those bytes over
  ``uvm - hbm``;
- an LRU cache (``MANAGED_CACHING``, load factor ``--load-factor``) looked up by the same batch every
  step, so that every lookup hits: ``hit - hbm`` is what the cache machinery (linearize, unique, lookup,
  prefetch, insert: once per cache and step) adds to a step that moves nothing.

The medians over the dimensions are written to ``--out`` (a ``step_models.Calibration``), which
``bench_traffic.py --calibration FILE`` prices the steps with, beside the stated assumptions. At the
defaults it finishes in under 5 minutes on one GPU with 40 GB (the dim-128 tables take 17 GB in HBM, and
as much of host memory); ``--scale`` shrinks them.

    .venv/bin/python benchmarks/bench_calibrate.py            # on a CUDA machine, FBGEMM's CUDA build
    .venv/bin/python benchmarks/bench_traffic.py --points benchmarks/figures/traffic_points.json \\
        --calibration benchmarks/figures/calibration.json

Without CUDA it exits with status 2 and says so: nothing here can time a GPU step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.arguments import fail
from benchmarks.common.cache_model import host_access
from benchmarks.common.step_models import Calibration
from fae_torchrec.arguments import fraction, non_negative_int, positive_float, positive_int
from fae_torchrec.data import SyntheticCriteo
from fae_torchrec.data.synthetic import CHUNK_SIZE

#: Bytes per embedding element (fp32 weights).
ELEMENT_BYTES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dims", type=positive_int, nargs="+", default=[16, 128], help="embedding dimensions"
    )
    parser.add_argument("--scale", type=positive_float, default=1.0, help="table sizes = Kaggle's x scale")
    parser.add_argument("--batch-size", type=positive_int, default=2048, help="inputs per step (per GPU)")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per placement")
    parser.add_argument("--warmup-steps", type=positive_int, default=5, help="untimed steps first")
    parser.add_argument(
        "--load-factor",
        type=fraction,
        default=0.2,
        help="the LRU cache's share of the rows (it holds a batch)",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/figures/calibration.json"))
    return parser.parse_args(argv)


def step_bytes(ids: np.ndarray, dim: int) -> float:
    """Bytes a step of a TBE without a cache moves in its busier direction, host to device: its rows as
    FBGEMM's kernels access them (``cache_model.host_access``). ``ids``: (inputs, tables) row ids."""
    tables = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    _, uses = np.unique(np.stack([tables.ravel(), ids.ravel()]), axis=1, return_counts=True)
    moved_in, _ = host_access(np.full(len(uses), float(dim * ELEMENT_BYTES)), uses)
    return float(moved_in.sum())


def calibrate(device: str, timings: dict[int, dict[str, float]], moved: dict[int, float]) -> Calibration:
    """The calibration from each dimension's step times (ms: ``hbm``, ``uvm``, ``hit``) and the bytes its
    UVM steps moved: the medians over the dimensions of ``moved / (uvm - hbm)`` and ``hit - hbm``.
    Raises ``ValueError`` where UVM was not slower than HBM (a measurement to repeat, not a figure)."""
    bandwidths, machinery = [], []
    for dim, times in timings.items():
        transfer_ms = times["uvm"] - times["hbm"]
        if transfer_ms <= 0:
            raise ValueError(f"dim {dim}: a UVM step ({times['uvm']:.3f} ms) was not slower than HBM's")
        bandwidths.append(moved[dim] / (transfer_ms * 1e-3) / 1e9)
        machinery.append(max(times["hit"] - times["hbm"], 0.0) * 1e3)
    return Calibration(device, float(np.median(bandwidths)), float(np.median(machinery)))


def batches(data: SyntheticCriteo, batch_size: int, count: int) -> list[np.ndarray]:
    """The first ``count`` batches of row ids (inputs, tables) of ``data``, the stream bench_traffic
    replays."""
    ids = np.concatenate([data.chunk(i).ids for i in range(-(-count * batch_size // CHUNK_SIZE))])
    return [ids[i * batch_size : (i + 1) * batch_size] for i in range(count)]


def _tbe(rows: list[int], dim: int, location: int, load_factor: float) -> torch.nn.Module:
    """FBGEMM's training TBE over tables of ``rows``, all at ``location``, with fused SGD."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return SplitTableBatchedEmbeddingBagsCodegen(
        [(n, dim, location, ComputeDevice.CUDA) for n in rows],
        cache_algorithm=CacheAlgorithm.LRU,
        cache_load_factor=load_factor,
        learning_rate=0.01,
        device=torch.device("cuda"),
    )


def _step_ms(tbe: torch.nn.Module, steps: list[np.ndarray], warmup: int) -> float:
    """Mean ms of a training step over the batches ``steps`` after ``warmup`` of them, each batch's
    lookups in table-major order, one per input and table."""
    inputs, tables = steps[0].shape
    offsets = torch.arange(inputs * tables + 1, dtype=torch.int64, device="cuda")
    prepared = [torch.from_numpy(np.ascontiguousarray(b.T).ravel()).to("cuda") for b in steps]
    for indices in prepared[:warmup]:
        tbe(indices, offsets).sum().backward()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for indices in prepared[warmup:]:
        tbe(indices, offsets).sum().backward()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (len(prepared) - warmup)


def main(argv: list[str] | None = None) -> Calibration:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        fail("bench_calibrate.py times FBGEMM's kernels on a CUDA GPU, and none is visible here")
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation

    started = time.perf_counter()
    count = args.warmup_steps + args.steps
    data = SyntheticCriteo(count * args.batch_size, scale=args.scale, seed=args.seed)
    rows = [config.num_embeddings for config in data.table_configs()]
    stream = batches(data, args.batch_size, count)
    timings, moved = {}, {}
    for dim in args.dims:
        times = {}
        for name, location in (("hbm", EmbeddingLocation.DEVICE), ("uvm", EmbeddingLocation.MANAGED)):
            tbe = _tbe(rows, dim, location, args.load_factor)
            times[name] = _step_ms(tbe, stream, args.warmup_steps)
            del tbe
        cached = _tbe(rows, dim, EmbeddingLocation.MANAGED_CACHING, args.load_factor)
        times["hit"] = _step_ms(cached, [stream[0]] * count, args.warmup_steps)  # every lookup hits
        del cached
        torch.cuda.empty_cache()
        timings[dim] = times
        moved[dim] = float(np.mean([step_bytes(b, dim) for b in stream[args.warmup_steps :]]))
        print(
            f"dim {dim}: step ms in HBM {times['hbm']:.3f}, in UVM {times['uvm']:.3f}, cached with every "
            f"lookup a hit {times['hit']:.3f}; a UVM step moves {moved[dim] / 2**20:.1f} MiB host to device"
        )
    try:
        calibration = calibrate(torch.cuda.get_device_name(), timings, moved)
    except ValueError as error:
        fail(str(error))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calibration.save(args.out)
    print(
        f"{calibration.device}: effective host-device bandwidth {calibration.effective_gbps:.1f} GB/s, cache "
        f"machinery {calibration.machinery_us:.1f} us per cache and step (medians over dims "
        f"{', '.join(map(str, args.dims))}); wrote {args.out} in {time.perf_counter() - started:.0f} s"
    )
    return calibration


if __name__ == "__main__":
    main()
