"""bench_calibrate.py up to its CUDA calls: the batches every placement runs, the caches' misses as
FBGEMM's LRU takes them, the fits that recover known figures from synthetic timings (negative machinery
kept, an unknown sign refused), the calibration file, and the collectives' timing on gloo ranks."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.bench_calibrate import (
    COLLECTIVES,
    CollectivePlan,
    batches,
    cache_size,
    calibrate,
    count_misses,
    fit_collectives,
    linear_rows,
    parse_args,
    prepare,
    schedule,
    step_bytes,
    time_collectives,
)
from benchmarks.common.calibration import Calibration, Collective, Estimate, fit_collective
from benchmarks.common.step_models import PCIE, Terms
from fae_torchrec.data import SyntheticCriteo
from tests.distributed import run_on_ranks

PLACEMENTS = ("hbm", "uvm", "hit", "miss")


def test_every_placement_times_the_same_fresh_batches_after_an_untimed_warm_up():
    """Every timed pass of every placement goes over batches 3..8, none of them the warm-up's 0..2; the
    caches are invalidated and warmed before each repeat, and the all-hit pass follows a pass that filled
    the cache with its very batches."""
    timed_batches = set()
    for placement in PLACEMENTS:
        passes = schedule(placement, warmup=3, steps=6, repeats=4)
        timed = [p for p in passes if p.timed]
        timed_batches |= {p.batches for p in timed}
        assert all(not p.timed and p.batches == (0, 1, 2) for p in passes if p.kind == "warm-up")
        assert len(timed) == 4 * (2 if placement == "hit" else 1)
        if placement in ("hit", "miss"):
            assert sum(p.reset for p in passes) == 4 and all(p.reset == (p.kind == "warm-up") for p in passes)
    assert timed_batches == {(3, 4, 5, 6, 7, 8)}, "one set of fresh batches for every placement"
    kinds = [p.kind for p in schedule("hit", 3, 6, 2)]
    assert kinds == ["warm-up", "cold", "hit"] * 2
    with pytest.raises(ValueError, match="unknown placement 'lfu'"):
        schedule("lfu", 3, 6, 2)


def _stream(count: int = 9, batch_size: int = 256) -> tuple[list[np.ndarray], list[int]]:
    data = SyntheticCriteo(count * batch_size, scale=0.002, seed=1)
    return batches(data, batch_size, count), [c.num_embeddings for c in data.table_configs()]


def test_the_caches_misses_are_counted_as_fbgemms_lru_takes_them():
    """A cache 4 times the rows it sees misses each row the first time since its invalidation and
    never evicts (so every lookup of the pass after hits); one of a quarter of the timed rows evicts; the
    counts repeat with every repeat, as the cache is invalidated each time."""
    stream, rows = _stream()
    linear = linear_rows(stream, rows)
    assert all(len(np.unique(b)) == len(b) for b in linear) and max(b.max() for b in linear) < sum(rows)
    seen = len(np.unique(np.concatenate(linear)))
    sets, load_factor = cache_size(4 * seen, sum(rows))
    assert sets == -(-4 * seen // 32) and int(sum(rows) * load_factor + 31) // 32 == sets, "FBGEMM's sets"
    counts = count_misses(linear, sets, schedule("hit", 3, 6, 2))
    assert counts["cold"].shape == counts["hit"].shape == (2, 2, 6)
    assert not counts["hit"].any() and not counts["cold"][1].any(), "all hits, nothing evicted"
    new_rows = [len(np.setdiff1d(linear[b], np.concatenate(linear[:b]))) for b in range(3, 9)]
    assert counts["cold"][0, 0].tolist() == new_rows
    timed_rows = len(np.unique(np.concatenate(linear[3:])))
    small, _ = cache_size(0.25 * timed_rows, sum(rows))
    missed, evicted = count_misses(linear, small, schedule("miss", 3, 6, 3))["miss"]
    assert (missed > np.array(new_rows)).all() and evicted.sum() > 0
    assert (missed == missed[0]).all() and (evicted == evicted[0]).all(), "the same every repeat"
    assert cache_size(10 * sum(rows), sum(rows))[0] == -(-sum(rows) // 32), "at most the table's rows"


def test_a_run_prepares_the_same_batches_and_caches_that_hit_and_miss_on_the_stream(capsys):
    """What bench_calibrate.py does before its first CUDA call, on the stream it times: its all-hit cache
    misses nothing in its hit passes and evicts nothing, the smaller one evicts, on the same batches."""
    args = parse_args("--scale 0.01 --batch-size 256 --steps 4 --warmup-steps 2 --repeats 2".split())
    stream, rows, caches, passes, counts = prepare(args)
    assert len(stream) == 6 and all(b.shape == (256, 26) for b in stream) and len(rows) == 26
    assert {p.batches for placement in passes.values() for p in placement if p.timed} == {(2, 3, 4, 5)}
    assert not counts["hit"].any() and not counts["cold"][1].any() and counts["cold"][0].all()
    assert counts["miss"][1].sum() > 0 and caches["miss"][0] < caches["hit"][0]
    assert "misses per step replayed: cold" in capsys.readouterr().out


def test_a_uvm_steps_bytes_are_its_rows_as_fbgemms_kernels_access_them():
    """Rows read at each lookup and once more for the backward."""
    ids = np.array([[0, 5], [0, 6], [1, 5]])  # table 0: row 0 twice, row 1; table 1: row 5 twice, row 6
    assert step_bytes(ids, 16) == 16 * 4 * ((2 + 1) + (1 + 1) + (2 + 1) + (1 + 1))


def _timings(machinery_ms: float, noise: float, seed: int = 0) -> tuple[dict, dict, dict]:
    """Synthetic step times of 3 repeats of 8 steps at dims 16 and 64, from known figures: 10 GB/s for
    64 B rows and 20 GB/s for 256 B rows, the given machinery, 0.5 us per missed row and 0.2 us per
    evicted row; ``noise`` ms spread per repeat."""
    rng = np.random.default_rng(seed)
    repeats, steps = 3, 8
    misses = np.repeat(rng.integers(1000, 5000, (2, 1, 2 * steps)), repeats, axis=1)
    misses[1, :, :steps] = 0  # the cold pass evicts nothing
    counts = {
        "cold": misses[:, :, :steps],
        "miss": misses[:, :, steps:],
        "hit": np.zeros((2, repeats, steps)),
    }
    timings, moved = {}, {}
    for dim, gbps in ((16, 10.0), (64, 20.0)):
        moved[dim] = rng.uniform(1e6, 3e6, steps)
        hbm = rng.uniform(1.0, 2.0, (1, steps)) + noise * rng.standard_normal((repeats, 1))
        hit = hbm + machinery_ms + noise * rng.standard_normal((repeats, 1))
        excess = (0.5 * misses[0] + 0.2 * misses[1]) * 1e-3
        timings[dim] = {
            "hbm": hbm,
            "uvm": hbm + moved[dim] / (gbps * 1e9) * 1e3,
            "hit": hit,
            "cold": hit + excess[:, :steps],
            "miss": hit + excess[:, steps:],
        }
    return timings, moved, counts


def test_the_fits_recover_known_bandwidth_machinery_and_miss_costs():
    timings, moved, counts = _timings(machinery_ms=0.03, noise=0.001)
    calibration = calibrate("a GPU", timings, moved, counts)
    assert calibration.bandwidth_gbps[64].median == pytest.approx(10.0)
    assert calibration.bandwidth_gbps[256].median == pytest.approx(20.0)
    for size in (64, 256):
        machinery = calibration.machinery_us[size]
        assert machinery.low < machinery.median < machinery.high and machinery.sign_known
        assert machinery.median == pytest.approx(30.0, abs=3.0)
        assert calibration.miss_us[size].median == pytest.approx(0.5)
        assert calibration.evict_us[size].median == pytest.approx(0.2)
    # a cache that made steps shorter is written as measured, not as 0
    negative = calibrate("a GPU", *_timings(machinery_ms=-0.02, noise=0.001))
    assert negative.machinery_us[64].high < 0 and negative.machinery_us[64].median == pytest.approx(
        -20, abs=3
    )


def test_the_fits_refuse_what_the_timings_cannot_tell():
    """Machinery whose repeats disagree on its sign, a UVM step no slower than HBM's, an all-hit cache that
    missed, and misses always evicting (their costs inseparable) are refused, naming the dimension."""
    timings, moved, counts = _timings(0.03, 0.001)
    timings[16]["hit"] = timings[16]["hbm"] + np.array([[-0.01], [0.02], [0.01]])
    with pytest.raises(
        ValueError, match=r"dim 16: the cache machinery's repeats disagree on its sign \(10 \[-10, 20\]"
    ):
        calibrate("a GPU", timings, moved, counts)
    timings, moved, counts = _timings(0.03, 0.001)
    timings[64]["uvm"] = timings[64]["hbm"] - 0.001
    with pytest.raises(ValueError, match="dim 64: UVM steps were not slower than HBM's in 3 of 3 repeats"):
        calibrate("a GPU", timings, moved, counts)
    timings, moved, counts = _timings(0.03, 0.001)
    counts["hit"][0, 1, 2] = 7
    with pytest.raises(ValueError, match="the all-hit cache missed 7 rows"):
        calibrate("a GPU", timings, moved, counts)
    counts["hit"][:] = 0
    counts["cold"][1] = counts["cold"][0]
    counts["miss"][1] = counts["miss"][0]
    with pytest.raises(ValueError, match="dim 16: missed and evicted rows are proportional"):
        calibrate("a GPU", timings, moved, counts)


def _calibration() -> Calibration:
    return Calibration(
        "a GPU",
        bandwidth_gbps={64: Estimate(4.0, 3.5, 4.5), 256: Estimate(16.0, 15.0, 17.0)},
        machinery_us={64: Estimate(-10.0, -12.0, -8.0), 256: Estimate(30.0, 25.0, 35.0)},
        miss_us={64: Estimate(0.5, 0.4, 0.6), 256: Estimate(0.7, -0.1, 0.9)},
        evict_us={64: Estimate(0.2, 0.1, 0.3), 256: Estimate(0.3, 0.2, 0.4)},
        world_size=2,
        collectives={"dp_all_reduce": Collective(20.0, 50.0, [1 << 20, 1 << 24], [41.0, 355.5])},
    )


def test_a_calibration_reads_back_and_prices_the_traffic_model_at_each_row_size(tmp_path):
    """Figures between two measured row sizes are interpolated in log row bytes, those outside take the
    nearest measured size; the bandwidth is a share of PCIe Gen4's, the machinery (negative here) in ms."""
    path = tmp_path / "calibration.json"
    _calibration().save(path)
    calibration = Calibration.load(path)
    assert calibration == _calibration()
    assert calibration.terms(128) == Terms(
        machinery_ms=pytest.approx(0.01), bandwidth_share=pytest.approx(10e9 / PCIE["Gen4"])
    )
    assert calibration.terms(16) == Terms(
        machinery_ms=pytest.approx(-0.01), bandwidth_share=pytest.approx(4e9 / PCIE["Gen4"])
    )
    assert calibration.bandwidth_at(4096) == 16.0
    assert calibration.collectives["dp_all_reduce"].time_us(1 << 20) == pytest.approx(20 + 2**20 / 50e3)
    text = calibration.describe()
    assert (
        "   64 B rows: effective host-device bandwidth 4 [3.5, 4.5] GB/s, cache machinery -10 [-12, -8]"
        in text
    )
    assert "dp_all_reduce at world size 2: 20.0 us + bytes / 50.0 GB/s" in text


def test_bad_calibration_files_are_refused_naming_the_field(tmp_path):
    path = tmp_path / "calibration.json"
    good = json.loads(json.dumps(_calibration(), default=lambda o: o.__dict__))

    def changed(**fields) -> dict:
        return {**good, **fields}

    bad_bandwidth = {"64": {"median": 0, "low": 0, "high": 1}, "256": good["bandwidth_gbps"]["256"]}
    either_sign = {"64": {"median": 1, "low": -1, "high": 2}, "256": good["machinery_us"]["256"]}
    for saved, message in (
        ("{", "not a calibration written by bench_calibrate.py"),
        ({"device": "x", "effective_gbps": 6.3, "machinery_us": 20.0}, "effective_gbps is the older format"),
        ({"device": "x"}, r"missing \['bandwidth_gbps', 'evict_us', 'machinery_us', 'miss_us'\]"),
        (changed(speed=1), r"unknown \['speed'\]"),
        (changed(bandwidth_gbps=bad_bandwidth), "bandwidth_gbps at 64 B must be positive in every repeat"),
        (changed(machinery_us=either_sign), "machinery_us at 64 B has repeats of either sign"),
        (changed(miss_us={"64": {"median": "fast", "low": 0, "high": 1}}), "miss_us at 64 B: median must be"),
        (changed(evict_us={"64": good["evict_us"]["64"]}), r"evict_us has row sizes \[64\]"),
        (changed(evict_us={"sixty": good["evict_us"]["64"]}), "evict_us has a row size 'sixty'"),
        (changed(world_size=0), "world_size must be a positive integer"),
        (changed(collectives={"x": {"latency_us": 1, "gbps": -2, "sizes": [], "us": []}}), "collectives.x"),
    ):  # fmt: skip
        path.write_text(saved if isinstance(saved, str) else json.dumps(saved))
        with pytest.raises(ValueError, match=message) as refused:
            Calibration.load(path)
        assert str(path) in str(refused.value)


def test_a_collectives_latency_and_bandwidth_are_fitted_over_its_sizes():
    sizes = [1 << 20, 1 << 23, 1 << 26]
    fitted = fit_collective(sizes, [15.0 + s / 40e3 for s in sizes])
    assert fitted.latency_us == pytest.approx(15.0) and fitted.gbps == pytest.approx(40.0)
    with pytest.raises(ValueError, match="at least two payload sizes"):
        fit_collective([1 << 20, 1 << 20], [1.0, 2.0])
    with pytest.raises(ValueError, match="time does not grow with size"):
        fit_collective(sizes, [30.0, 20.0, 10.0])
    plan = CollectivePlan(8, 26, 128, (512, 2048), (1 << 20, 1 << 24))
    assert plan.tables_of() == [4, 4, 3, 3, 3, 3, 3, 3]
    assert plan.payloads("tw_all_to_all") == [512 * 8 * 26 * 128 * 4, 2048 * 8 * 26 * 128 * 4]
    medians = {name: [10.0 + b / 25e3 for b in plan.payloads(name)] for name in COLLECTIVES}
    fitted = fit_collectives(plan, medians)
    assert all(fitted[name].gbps == pytest.approx(25.0) for name in COLLECTIVES)
    with pytest.raises(ValueError, match="rw_reduce_scatter: time does not grow"):
        fit_collectives(plan, medians | {"rw_reduce_scatter": [5.0, 5.0]})


def _time_on_rank(rank: int, world_size: int, plan: CollectivePlan, out: str) -> None:
    medians = time_collectives(rank, plan, torch.device("cpu"))
    if rank == 0:
        Path(out).write_text(json.dumps(medians))


def test_the_collectives_are_timed_on_gloo_ranks_with_their_outputs_checked(tmp_path):
    """The timing code as a GPU runs it, on 2 gloo ranks of the CPU: 3 tables split 2 and 1 (uneven
    all-to-alls), every collective's output checked once (a wrong one raises on its rank), a time for
    every collective and size."""
    plan = CollectivePlan(2, 3, 4, (8, 32), (4096, 65536), calls=3, warmup=1)
    out = tmp_path / "medians.json"
    run_on_ranks(_time_on_rank, 2, tmp_path, plan, str(out))
    medians = json.loads(out.read_text())
    assert set(medians) == set(COLLECTIVES)
    assert all(len(times) == 2 and min(times) > 0 for times in medians.values())
