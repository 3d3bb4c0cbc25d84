"""Popularity drift: the hot-input share of a day-0 hot set over drifting days, with and without re-planning.

Streams Criteo-like inputs (``SyntheticCriteo``) over ``--days`` days whose popularity rotates by ``--drift``
of each table's rows per day, in time order, ``--step-inputs`` inputs a step (one global batch). FAE's
planner plans a 5% profile of day 0's first ``--profile-steps`` steps (which the stream then skips) on a
``--gpus``-GPU topology of ``--hbm-cap`` each, at ``--budget`` (weights). Hot sets of
that budget are followed step by step:

* ``never``: the day-0 hot set all along (no re-planning);
* ``every``: every ``--every`` steps, the hot set of the recent counts (``RecentAccessCounts`` of a 5%
  sample of the steps streamed, half-life ``--half-life`` steps) when it covers more of the recent
  held-out inputs beyond chance (``Replanner``, policy ``every``; a stream's rest is unknown, so the
  recent inputs stand for it);
* ``auto``: the same hot set, when the share of the last ``--every`` steps has clearly fallen below the
  plan's and the move pays (``Replanner``, policy ``auto``; see below);
* ``today``: a reference, the hot set of a 5% profile of the current day.

Each step's share is measured on its inputs that neither the recent counts nor today's profile sampled
(every such input classified), so no share is measured on inputs that chose its hot set. Predicted
step (ms, sparse part, TorchRec's perf model): ``share x hot step + (1 - share) x cold step``, the hot and
cold steps of the day-0 plan (a re-plan keeps the budget and, it is assumed, the prices).

Whether a re-plan pays (``auto``): the inputs it turns hot over the rest of the stream, which stands for
``--represents`` inputs a day (Criteo Terabyte's by default: the synthetic stream is a sample of a day),
times the perf model's saving per input, against the re-plan's cost: the decision (measured here), the
re-partition of the rest of the day (today's inputs are partitioned already; a later day is partitioned
as it comes, with the hot set of then; classifying an input is timed here) and the row move
(``--move-seconds``: ``bench_replan.py`` measures it at Kaggle sizes). Prints the shares and predicted
steps per day, the re-plans with their cost, and the hot-input share recovered per second of re-plan;
writes ``bench_drift.png`` to ``--figures`` and every figure to ``bench_drift.json`` in ``--out``::

    python benchmarks/bench_drift.py                    # 8 days of 100,000 inputs: ~25 s on 2 cores
    python benchmarks/bench_drift.py --drift 0          # stationary data
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from torchrec.distributed.sharding_plan import get_default_sharders
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fae_torchrec import AccessProfiler
from fae_torchrec.arguments import byte_size, fraction, positive_int, share
from fae_torchrec.data import SampleBlock, SyntheticCriteo
from fae_torchrec.stats import COLD, HOT, HotSet, RecentAccessCounts, estimate_hot_share
from fae_torchrec.train.replan import Replanner, ReplanPolicy
from fae_torchrec.train.schedule import Step
from fae_torchrec.units import format_bytes, parse_bytes
from planner import FAEShardingPlanner
from planner.topology import make_topology

#: The re-planning policies followed, and every hot set followed, in the order they are drawn.
REPLANNED = ("every", "auto")
POLICIES = ("never", *REPLANNED, "today")
#: Criteo Terabyte: about 4.37 billion inputs over 24 days.
TERABYTE_DAY = 4_373_472_329 // 24
#: The profile's sample (FAE's, for DLRM) and the recent counts' sample and holdout.
SAMPLE = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=positive_int, default=8, help="days of the stream")
    parser.add_argument("--inputs-per-day", type=positive_int, default=100_000, help="synthetic inputs a day")
    parser.add_argument("--drift", type=share, default=0.0001, help="share of a table's rows rotated a day")
    parser.add_argument("--scale", type=float, default=0.05, help="table sizes = Criteo Kaggle's x scale")
    parser.add_argument("--dim", type=positive_int, default=16, help="embedding dimension")
    parser.add_argument("--step-inputs", type=positive_int, default=4096, help="inputs a step (global batch)")
    parser.add_argument("--gpus", type=positive_int, default=1, help="GPUs of the planned topology")
    parser.add_argument("--budget", type=byte_size, default="1MiB", help="hot-row budget (weights)")
    parser.add_argument("--hbm-cap", type=byte_size, default="32MiB", help="HBM per GPU of the topology")
    parser.add_argument("--profile-steps", type=positive_int, default=20, help="day 0's steps profiled")
    parser.add_argument("--every", type=positive_int, default=10, help="steps between checks, and the window")
    parser.add_argument("--half-life", type=float, default=24.0, help="recent counts' half-life, steps")
    parser.add_argument("--margin", type=fraction, default=0.02, help="share fall that counts as drift")
    parser.add_argument(
        "--represents", type=positive_int, default=TERABYTE_DAY, help="inputs a day stands for"
    )
    parser.add_argument(
        "--move-seconds",
        type=float,
        default=19.0,
        help="a row move's cost (bench_replan.py: 19 s at Kaggle sizes)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data seed")
    parser.add_argument("--out", default="runs/bench_drift", help="bench_drift.json goes here")
    parser.add_argument("--figures", default="benchmarks/figures", help="bench_drift.png goes here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    data = SyntheticCriteo(
        args.inputs_per_day * args.days, batch_size=args.step_inputs, scale=args.scale, seed=args.seed,
        days=args.days, drift=args.drift,
    )  # fmt: skip
    keys, tables = data.feature_names, data.table_configs(args.dim)
    day_blocks = [_day(data, day) for day in range(args.days)]
    profiled, day_blocks[0] = day_blocks[0][: args.profile_steps], day_blocks[0][args.profile_steps :]
    stats = AccessProfiler(tables, SAMPLE, seed=args.seed).profile(b.to_batch(keys) for b in profiled)
    planner = FAEShardingPlanner(
        make_topology(args.gpus, hbm_cap=parse_bytes(args.hbm_cap)),
        stats,
        batch_size=args.step_inputs // args.gpus,
        hot_budget_bytes=parse_bytes(args.budget),
    )
    hot_set = planner.choose_hot_set()
    planner.plan(planner.meta_module(hot_set), get_default_sharders())
    report = planner.report
    budget = report.hot_budget_bytes  # the knob's choice (or --budget), kept by every hot set followed
    counts = RecentAccessCounts(
        tables, capacity=4 * np.maximum([len(ids) for ids in hot_set.hot_ids], 256), sample_fraction=SAMPLE,
        half_life=args.half_life, holdout_fraction=SAMPLE, seed=args.seed,
        holdout_size=round(SAMPLE * args.step_inputs * args.half_life),  # the inputs held out in a half-life
    )  # fmt: skip
    replanners = {
        mode: Replanner(
            counts,
            hot_set,
            estimate_hot_share(stats, hot_set),
            budget,
            None,
            ReplanPolicy(mode, every=args.every, window=args.every, margin=args.margin),
        )
        for mode in REPLANNED
    }
    share: dict[str, list[float]] = {p: [] for p in POLICIES}
    days: list[int] = []
    replans: dict[str, list[dict]] = {mode: [] for mode in REPLANNED}
    left = sum(len(b) for blocks in day_blocks for b in blocks)  # inputs not streamed yet
    classify = [0.0, 0]  # seconds and inputs of classifying against one hot set
    bar = tqdm(total=sum(map(len, day_blocks)), desc="streaming", unit="step")
    for day, blocks in enumerate(day_blocks):
        today, sampled_today = _profile(
            tables, profiled * (day == 0) + blocks, keys, budget, args.seed + 1 + day
        )
        left_today = sum(map(len, blocks))
        for block, sampled in zip(blocks, sampled_today[len(sampled_today) - len(blocks) :], strict=True):
            ids = block.feature_ids(keys)
            counted, held = counts.draw(len(block))
            measured = ~sampled
            measured[counted] = False
            chosen = {key: values[measured] for key, values in ids.items()}
            current = {"never": hot_set, **{m: r.hot_set for m, r in replanners.items()}, "today": today}
            for name, hot in current.items():
                started = time.perf_counter()
                share[name].append(float(hot.is_hot_input(chosen).mean()))
                classify[0] += time.perf_counter() - started
                classify[1] += int(measured.sum())
            counts.add({k: v[counted] for k, v in ids.items()}, {k: v[held] for k, v in ids.items()})
            days.append(day)
            left -= len(block)
            left_today -= len(block)
            bar.update()
            for mode, replanner in replanners.items():
                hot_now = int(replanner.hot_set.is_hot_input(ids).sum())
                replanner.observe(Step(False, (((HOT, 0, hot_now), (COLD, 0, len(block) - hot_now)),)))
                if replanner.due(len(days)):
                    replan = _check(
                        replanner, args, (left, left_today), classify, report.hot_step, report.cold_step
                    )
                    if replan is not None:
                        replans[mode].append({"step": len(days), "day": day, **replan})
    bar.close()
    result = _summary(args, share, np.array(days), replans, report, counts)
    result["budget"] = budget
    _report(result)
    _plot(result, share, np.array(days), Path(args.figures))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_drift.json").write_text(json.dumps(result, indent=1))
    return result


def _check(
    replanner: Replanner,
    args: argparse.Namespace,
    left: tuple[int, int],
    classify: list,
    hot_ms: float,
    cold_ms: float,
) -> dict | None:
    """A check of ``replanner``'s policy; on a re-plan, moves it to the new hot set and returns what the
    re-plan cost and recovered. ``left``: inputs not streamed yet, of the stream and of today."""
    started = time.perf_counter()
    scale = args.represents / args.inputs_per_day
    # today's inputs are partitioned already; later days are partitioned as they come, by the hot set then
    partition_seconds = left[1] * scale * classify[0] / max(classify[1], 1)
    decision = replanner.decide(
        round(left[0] * scale),
        args.step_inputs,
        hot_ms / 1000,
        cold_ms / 1000,
        args.move_seconds + partition_seconds,
    )
    decided = time.perf_counter() - started
    if not decision.replan:
        return None
    replanner.moved_to(decision.hot_set, decision.proposed)
    return {
        "measured": decision.measured.share, "planned": decision.planned.share,
        "current": decision.current.share, "proposed": decision.proposed.share,
        "rows_moved": decision.rows_moved, "bytes_moved": decision.bytes_moved, "decision_seconds": decided,
        "partition_seconds": partition_seconds, "move_seconds": args.move_seconds,
        "gain_seconds": decision.gain_seconds,
    }  # fmt: skip


def _day(data: SyntheticCriteo, day: int) -> list[SampleBlock]:
    """Day ``day``'s inputs in steps (the data's blocks cut at the day's bounds)."""
    start, stop = data.day_starts()[day : day + 2]
    blocks, position = [], 0
    for block in data.blocks():
        low, high = max(start - position, 0), min(stop - position, len(block))
        if low < high:
            blocks.append(block.slice(low, high))
        position += len(block)
        if position >= stop:
            break
    return blocks


def _profile(
    tables, blocks: list[SampleBlock], keys, budget: int, seed: int
) -> tuple[HotSet, list[np.ndarray]]:
    """The hot set of ``budget`` from a 5% profile of ``blocks`` (a day), and per block the inputs it
    sampled."""
    profiler = AccessProfiler(tables, SAMPLE, seed=seed, holdout_size=0)
    sampled = [profiler.update(block.to_batch(keys)) for block in blocks]
    return profiler.stats().hot_set(budget), sampled


def _summary(args, share: dict, days: np.ndarray, replans: dict, report, counts: RecentAccessCounts) -> dict:
    """Per day, each hot set's mean share and predicted step; per policy its re-plans, their cost and the
    share they recovered per second; the watching's memory."""
    per_day = {
        name: [float(np.mean(np.array(values)[days == d])) for d in range(args.days)]
        for name, values in share.items()
    }
    policies = {}
    for mode, done in replans.items():
        seconds = sum(r["decision_seconds"] + r["partition_seconds"] + r["move_seconds"] for r in done)
        recovered = sum(r["proposed"] - r["current"] for r in done)
        policies[mode] = {
            "replans": done,
            "seconds": seconds,
            "share_recovered_per_second": recovered / seconds if seconds else None,
            "worst_gap_to_today": max(
                abs(a - t) for a, t in zip(per_day[mode], per_day["today"], strict=True)
            ),
        }
    return {
        "options": {k: v for k, v in vars(args).items() if k not in ("out", "figures")},
        "hot_step_ms": report.hot_step,
        "cold_step_ms": report.cold_step,
        "share_per_day": per_day,
        "predicted_step_ms_per_day": {
            name: [s * report.hot_step + (1 - s) * report.cold_step for s in values]
            for name, values in per_day.items()
        },
        "policies": policies,
        "watch_bytes_per_table": counts.bytes_per_table().tolist(),
        "watch_holdout_bytes": counts.holdout_bytes(),
    }


def _report(result: dict) -> None:
    per_day, predicted = result["share_per_day"], result["predicted_step_ms_per_day"]
    print(
        f"day  {'  '.join(f'{p:>6}' for p in POLICIES)}   predicted step, ms (perf model; hot "
        f"{result['hot_step_ms']:.3f}, cold {result['cold_step_ms']:.3f})"
    )
    for day in range(len(per_day["never"])):
        shares = "  ".join(f"{100 * per_day[p][day]:5.1f}%" for p in POLICIES)
        print(f"{day:>3}  {shares}   {'  '.join(f'{predicted[p][day]:.4f}' for p in POLICIES)}")
    for mode, policy in result["policies"].items():
        done = policy["replans"]
        gap = 100 * policy["worst_gap_to_today"]
        recovered = (
            f"; {100 * policy['share_recovered_per_second']:.3f} points recovered per second" if done else ""
        )
        print(f"{mode}: {len(done)} re-plans; largest gap to today's profile {gap:.1f} points{recovered}")
        for r in done[:3]:
            shares = f"{100 * r['current']:.1f}% -> {100 * r['proposed']:.1f}%"
            cost = (
                f"decision {r['decision_seconds']:.2f} s, re-partition {r['partition_seconds']:.1f} s, "
                f"move {r['move_seconds']:.0f} s (given)"
            )
            print(
                f"  step {r['step']} (day {r['day']}): {100 * r['measured']:.1f}% against the plan's "
                f"{100 * r['planned']:.1f}%; recent inputs {shares}; {r['rows_moved']} rows "
                f"({format_bytes(r['bytes_moved'])}); {cost}"
            )
    watch = np.array(result["watch_bytes_per_table"])
    most, total = format_bytes(int(watch.max())), format_bytes(int(watch.sum()))
    held = format_bytes(result["watch_holdout_bytes"])
    print(f"watching: at most {most} per table ({total} in all) and {held} of recent held-out inputs")


def _plot(result: dict, share: dict, days: np.ndarray, figures: Path) -> None:
    figures.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, len(days) + 1)
    window = 5
    for name in POLICIES:
        smooth = np.convolve(100 * np.array(share[name]), np.ones(window) / window, mode="valid")
        left.plot(steps[window - 1 :], smooth, label=name, linewidth=0.9)
    for r in result["policies"]["auto"]["replans"]:
        left.axvline(r["step"], color="grey", linewidth=0.5, linestyle=":")
    left.set_xlabel("step, in time order (dotted: auto's re-plans)")
    left.set_ylabel(f"hot-input share, % (moving mean of {window} steps)")
    left.legend()
    for name in POLICIES:
        right.plot(result["predicted_step_ms_per_day"][name], marker="o", label=name)
    right.set_xlabel("day")
    right.set_ylabel("predicted step, ms (perf model, sparse part)")
    right.legend()
    options = result["options"]
    fig.suptitle(f"popularity rotating by {options['drift']} of each table's rows a day")
    fig.tight_layout()
    fig.savefig(figures / "bench_drift.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
