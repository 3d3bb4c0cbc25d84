"""The planned cold tier's copies on a GPU: a cold step's write-backs, loads and remap issued as the tier
issues them, against the same steps with every row in device memory (issue 48).

The device machines lend CUDA PyTorch without FBGEMM or TorchRec, so this script needs torch and numpy
alone: it loads the tier's copy engine (``fae_torchrec/train/copy_engine.py``) and slot plan
(``slot_plan.py``) from their files, and stands in for the rest with plain tensors: one cold table of
``--rows`` rows (the tier's run of adjacent tables is one such buffer), its weights and RowWiseAdagrad's
one state per row, looked up by ``embedding_bag`` (sum) and updated by RowWiseAdagrad written in torch,
and ``--dense-ms`` of matrix products for the rest of the step. Steps draw ``--batch-size`` x
``--features`` ids from a Zipf law over the rows; the hot set is the ``--hot-rows`` most frequent ids of
a disjoint profile, and a step's cold ids (the ones not hot) are what the tier moves.

Modes, on the same steps in one run:

- ``resident``: the whole table in device memory (no copies: the bound the tier is measured against);
- ``planned K``: ``--slots`` slots in device memory, the rows in pinned host memory; before each step the
  tier's work: the engine settles, issues the copies of the step K steps on (write-backs, then loads) on
  its side stream, the step waits for its own copies, the ids are remapped to slots by an array over
  every row (as ``PlannedColdTier`` does) and copied to the device;
- ``mapped K`` (CUDA): the same with the engine's ``mapped`` copies: the device gathers the loads from
  and scatters the write-backs into the pinned host rows itself, the host only issues the kernels.

Printed: ms per step (wall clock, the GPU synchronised at the end), the ratio to ``resident``, the
host's own ms per step for the copies and for the remap, bytes moved per step, and the largest
difference between the trained rows and ``resident``'s (exactness on the device; 0 on CPU).

    python benchmarks/bench_copy_engine.py                   # CPU: small defaults, copies inline
    python benchmarks/bench_copy_engine.py --aheads 0 1 2     # a CUDA machine: 10M rows x 128, both copies
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
#: Defaults with CUDA, and the smaller ones on CPU (keys are the options' destinations).
CUDA_DEFAULTS = {"rows": 10_000_000, "dim": 128, "batch_size": 4096, "steps": 400, "hot_rows": 1_000_000}
CPU_DEFAULTS = {"rows": 200_000, "dim": 16, "batch_size": 256, "steps": 60, "hot_rows": 10_000}


def _load(name: str):
    """A module of ``fae_torchrec/train`` loaded from its file: the package would import TorchRec."""
    spec = importlib.util.spec_from_file_location(
        f"_fae_{name}", ROOT / "fae_torchrec" / "train" / f"{name}.py"
    )
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


copy_engine = _load("copy_engine")
slot_plan = _load("slot_plan")


def _count(text: str) -> int:
    """``20M``, ``500k`` or a plain integer, at least 1."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def parse_args(argv: list[str] | None, cuda: bool) -> argparse.Namespace:
    defaults = CUDA_DEFAULTS if cuda else CPU_DEFAULTS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=_count, help=f"rows of the cold table (default {defaults['rows']:,})")
    parser.add_argument("--dim", type=_count, help=f"embedding dimension (default {defaults['dim']})")
    parser.add_argument("--batch-size", type=_count, help=f"inputs per step ({defaults['batch_size']})")
    parser.add_argument("--features", type=_count, default=26, help="ids per input (26, Criteo's)")
    parser.add_argument("--steps", type=_count, help=f"timed steps (default {defaults['steps']})")
    parser.add_argument("--warmup", type=_count, default=20, help="steps before the timed ones")
    parser.add_argument("--hot-rows", type=_count, help=f"rows FAE keeps hot ({defaults['hot_rows']:,})")
    parser.add_argument("--alpha", type=float, default=1.05, help="the Zipf exponent of the ids")
    parser.add_argument("--slots", type=_count, help="the tier's slots (default 8x the largest step's rows)")
    parser.add_argument("--aheads", type=int, nargs="+", default=[0, 1], help="copies K steps ahead")
    parser.add_argument(
        "--copies",
        choices=("staged", "mapped"),
        nargs="+",
        help="the engine's copies: staged through the host (the tier's), mapped (the device's own gathers "
        "and scatters of pinned host rows; CUDA only) (default: both on CUDA, staged on CPU)",
    )
    parser.add_argument("--dense-ms", type=float, default=1.0, help="the rest of a step on the device (ms)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.copies is None:
        args.copies = ["staged", "mapped"] if cuda else ["staged"]
    if "mapped" in args.copies and not cuda:
        parser.error("--copies mapped: needs CUDA (on CPU the copies are the same plain copies)")
    if args.hot_rows >= args.rows:
        parser.error(f"--hot-rows ({args.hot_rows}) must be fewer than --rows ({args.rows})")
    if min(args.aheads) < 0:
        parser.error(f"--aheads must be at least 0, got {args.aheads}")
    if args.alpha <= 1:
        parser.error(f"--alpha must be above 1, got {args.alpha}")
    if args.dense_ms < 0:
        parser.error(f"--dense-ms must be at least 0, got {args.dense_ms}")
    return args


def cold_steps(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cold ids of ``--warmup`` + ``--steps`` steps, the input of each id and the steps' bounds: Zipf
    ids over the rows (the popular rows spread over the table), the hot set the ``--hot-rows`` most frequent
    ids of a disjoint profile of 50 steps' ids."""
    rng = np.random.default_rng(args.seed)
    rank_of = rng.permutation(args.rows)
    per_step = args.batch_size * args.features

    def draw(n: int) -> np.ndarray:
        ranks = np.zeros(0, dtype=np.int64)
        while len(ranks) < n:
            more = rng.zipf(args.alpha, size=n) - 1
            ranks = np.concatenate([ranks, more[more < args.rows]])
        return rank_of[ranks[:n]]

    profile = np.bincount(draw(50 * per_step), minlength=args.rows)
    hot = np.zeros(args.rows, dtype=bool)
    hot[np.argsort(profile, kind="stable")[::-1][: args.hot_rows]] = True
    num_steps = args.warmup + args.steps
    ids = draw(per_step * num_steps)
    cold = np.flatnonzero(~hot[ids])
    step = cold // per_step
    return ids[cold], (cold % per_step) // args.features, np.searchsorted(step, np.arange(num_steps + 1))


class Steps:
    """The steps on ``device``: each step's ids, and on the device the offsets of its inputs' bags, the
    bag of each id, the first position of each distinct row and each id's distinct row (known ahead, as
    the loader knows them, so that no step waits for the device); the dense part's operands
    (``matmuls`` products of ``dense`` with itself)."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.ids, inputs, self.bounds = cold_steps(args)
        self.num_steps = len(self.bounds) - 1
        self.device = device
        self._layout = []
        for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True):
            _, first, inverse = np.unique(self.ids[a:b], return_index=True, return_inverse=True)
            offsets = np.searchsorted(inputs[a:b], np.arange(args.batch_size))
            self._layout.append(
                tuple(torch.from_numpy(x).to(device) for x in (offsets, inputs[a:b], first, inverse))
            )
        size = 2048 if device.type == "cuda" else 64
        self.dense = torch.randn((size, size), device=device)
        self._scratch = torch.empty_like(self.dense)
        self.matmuls = self._calibrate(args.dense_ms)

    def step_ids(self, step: int) -> np.ndarray:
        return self.ids[self.bounds[step] : self.bounds[step + 1]]

    def _calibrate(self, dense_ms: float) -> int:
        """Products of ``dense`` that take about ``dense_ms`` on the device."""
        self.dense_part(10)
        _synchronize(self.device)
        started = time.perf_counter()
        self.dense_part(50)
        _synchronize(self.device)
        return round(dense_ms / (1e3 * (time.perf_counter() - started) / 50))

    def dense_part(self, matmuls: int) -> None:
        for _ in range(matmuls):
            torch.mm(self.dense, self.dense, out=self._scratch)

    def run(self, step: int, ids: np.ndarray, weight: torch.Tensor, state: torch.Tensor) -> None:
        """One step on ``ids`` (rows of ``weight``, copied to the device as a loader does: from pinned
        memory without waiting): lookup, dense part, RowWiseAdagrad's update of the distinct rows."""
        ids = torch.from_numpy(ids)
        if self.device.type == "cuda":
            ids = ids.pin_memory().to(self.device, non_blocking=True)
        offsets, bag_of, first, inverse = self._layout[step]
        pooled = F.embedding_bag(ids, weight, offsets, mode="sum")
        self.dense_part(self.matmuls)
        grad = torch.cos(pooled)  # d loss / d pooled of loss = sum(sin(pooled))
        rows = ids[first]
        row_grad = torch.zeros((len(first), weight.shape[1]), device=self.device)
        row_grad.index_add_(0, inverse, grad[bag_of])
        state[rows] += row_grad.square().mean(1)
        weight[rows] -= 0.01 * row_grad / (state[rows].sqrt() + 1e-8)[:, None]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resident(steps: Steps, weight: torch.Tensor, state: torch.Tensor, warmup: int) -> dict:
    """Every step on the whole table in device memory; ms per timed step."""
    started = 0.0
    for step in range(steps.num_steps):
        if step == warmup:
            _synchronize(steps.device)
            started = time.perf_counter()
        steps.run(step, steps.step_ids(step), weight, state)
    _synchronize(steps.device)
    timed = steps.num_steps - warmup
    return {"ms": 1e3 * (time.perf_counter() - started) / timed, "weight": weight.cpu()}


class HostClock:
    """The host's seconds per part of the tier's work before a step (``with clock("part"): ...``)."""

    PARTS = ("collect", "out", "in", "remap")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.PARTS, 0.0)

    @contextmanager
    def __call__(self, part: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds[part] += time.perf_counter() - started


def planned(
    steps: Steps,
    weight: torch.Tensor,
    state: torch.Tensor,
    num_slots: int,
    ahead: int,
    warmup: int,
    mapped: bool = False,
) -> dict:
    """Every step on ``num_slots`` device slots filled by the slot plan's copies ``ahead`` steps early
    (host rows ``weight`` and ``state``, pinned on CUDA); ms per timed step, the host's ms per step in
    each part of the tier's work (the write-backs collected, the write-backs issued, the loads issued,
    the remap), bytes per step, and the plan's seconds."""
    device = steps.device
    started = time.perf_counter()
    plan = slot_plan.plan_slots(steps.ids, steps.bounds, num_slots, ahead=ahead)
    plan_seconds = time.perf_counter() - started
    host = {"weight": weight, "state": state}
    if device.type == "cuda":
        host = {name: rows.pin_memory() for name, rows in host.items()}
    slots = {name: torch.zeros((num_slots, *rows.shape[1:]), device=device) for name, rows in host.items()}
    engine = copy_engine.CopyEngine(device, mapped=mapped)
    slot_of = np.zeros(len(weight), dtype=np.int32)
    clock, moved = HostClock(), 0
    for step in range(steps.num_steps):
        if step == warmup:
            _synchronize(device)
            started, clock, moved = time.perf_counter(), HostClock(), 0
        copied = slot_plan.copied_before(step, ahead, steps.num_steps)
        with clock("collect"):
            engine.collect()
        with engine.copying(copied), torch.no_grad():
            for s in copied:
                out_rows, out_slots = plan.evictions(s)
                in_rows, in_slots = plan.loads(s)
                with clock("out"):
                    index = engine.index(out_slots)
                    for name, rows in host.items():
                        engine.to_host(rows, torch.from_numpy(out_rows), slots[name].index_select(0, index))
                with clock("in"):
                    index = engine.index(in_slots)
                    for name, rows in host.items():
                        engine.to_device(slots[name], index, rows, torch.from_numpy(in_rows))
                moved += sum((len(out_rows) + len(in_rows)) * rows[0].nbytes for rows in host.values())
        engine.wait(step)
        with clock("remap"):
            rows, held = plan.step_rows(step)
            np.put(slot_of, rows, held)
            ids = np.take(slot_of, steps.step_ids(step)).astype(np.int64)
        steps.run(step, ids, slots["weight"], slots["state"])
    _synchronize(device)
    timed = steps.num_steps - warmup
    ms = 1e3 * (time.perf_counter() - started) / timed
    engine.settle()
    for name, rows in host.items():  # the residents go home
        resident_slots = torch.from_numpy(plan.resident_slots).to(device)
        rows[torch.from_numpy(plan.resident_rows)] = slots[name][resident_slots].cpu()
    return {
        "ms": ms,
        **{f"{part}_ms": 1e3 * seconds / timed for part, seconds in clock.seconds.items()},
        "mib": moved / timed / 2**20,
        "plan_s": plan_seconds,
        "weight": host["weight"],
    }


def link_gbps(device: torch.device, nbytes: int = 256 * 2**20) -> tuple[float, float]:
    """GB/s of one copy of ``nbytes`` between pinned host memory and ``device``, each way (best of 5)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for target, source in ((on_device, host), (host, on_device)):
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            target.copy_(source, non_blocking=True)
            torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - started)
        rates.append(nbytes / best / 1e9)
    return rates[0], rates[1]


def main(argv: list[str] | None = None) -> dict[str, dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args = parse_args(argv, device.type == "cuda")
    steps = Steps(args, device)
    distinct = max(len(np.unique(steps.step_ids(s))) for s in range(steps.num_steps))
    num_slots = args.slots or 8 * distinct
    inputs = args.batch_size * steps.num_steps
    print(
        f"{device.type}: {args.rows:,} rows x {args.dim}, {steps.num_steps} steps of {args.batch_size} "
        f"inputs x {args.features} ids, {len(steps.ids) / steps.num_steps:,.0f} cold ids per step (at most "
        f"{distinct:,} distinct), {num_slots:,} slots, the dense part {steps.matmuls} products "
        f"(--dense-ms {args.dense_ms})"
    )
    if device.type == "cuda":
        print(
            "pinned copies: {:.1f} GB/s host to device, {:.1f} GB/s device to host".format(*link_gbps(device))
        )
    generator = torch.Generator().manual_seed(args.seed)
    weight = torch.randn((args.rows, args.dim), generator=generator) * 0.01
    state = torch.zeros(args.rows)
    results = {
        "resident": resident(steps, weight.to(device, copy=True), state.to(device, copy=True), args.warmup)
    }
    for copies, ahead in itertools.product(args.copies, args.aheads):
        name = f"{'planned' if copies == 'staged' else 'mapped'} {ahead}"
        try:
            results[name] = planned(
                steps, weight.clone(), state.clone(), num_slots, ahead, args.warmup, copies == "mapped"
            )
        except ValueError as error:  # too few slots for the copies this far ahead
            print(f"{name}: {error}")
    base = results["resident"]
    parts = " | ".join(f"{part:>7}" for part in HostClock.PARTS)
    print(f"mode        | ms/step | x resident | host ms: {parts} | MiB/step | plan s/1M | max diff")
    for name, r in results.items():
        r["max_diff"] = float((r["weight"] - base["weight"]).abs().max())
        row = f"{name:<11} | {r['ms']:7.3f} | {r['ms'] / base['ms']:10.3f} | "
        if name == "resident":
            print(row + " " * (len(parts) + 9) + f" | {'':>8} | {'':>9} | {r['max_diff']:.2e}")
            continue
        host = " | ".join(f"{r[f'{part}_ms']:7.3f}" for part in HostClock.PARTS)
        print(
            row
            + f"         {host} | {r['mib']:8.2f} | {r['plan_s'] / inputs * 1e6:9.2f} | {r['max_diff']:.2e}"
        )
    return results


if __name__ == "__main__":
    main()
