"""What ``bench_calibrate.py`` measures on a GPU with FBGEMM, the fits that turn its timings into
figures, and the file ``bench_traffic.py --calibration`` reads them from.

Every figure is an ``Estimate`` over repeated timings (median, lowest and highest repeat), never
clamped: a cache machinery cost below 0 is written as measured, and one whose repeats disagree on its
sign is refused. Figures that depend on the row size are keyed by row bytes (dim x 4 for fp32), and
looked up between two measured sizes by interpolating in log row bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from benchmarks.common.step_models import PCIE, Terms

#: Bytes per embedding element (fp32 weights).
ELEMENT_BYTES = 4
#: The figures measured at each row size.
ROW_FIGURES = ("bandwidth_gbps", "machinery_us", "miss_us", "evict_us")


@dataclass(frozen=True)
class Estimate:
    """A figure measured over repeats: the median and the lowest and highest repeat."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray | list[float]) -> Estimate:
        values = np.asarray(values, dtype=np.float64)
        return cls(float(np.median(values)), float(values.min()), float(values.max()))

    @property
    def sign_known(self) -> bool:
        """Whether every repeat has the same sign (and none is 0)."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.median:.3g} [{self.low:.3g}, {self.high:.3g}]"


@dataclass(frozen=True)
class Collective:
    """A collective's time fitted as ``latency_us + bytes / gbps`` over the ``sizes`` (bytes of the
    payload: a layout's pooled embeddings of the global batch, or the gradients all-reduced) at which it
    was timed (``us``: the median over calls of the slowest rank)."""

    latency_us: float
    gbps: float
    sizes: list[int]
    us: list[float]

    def time_us(self, nbytes: float) -> float:
        return self.latency_us + nbytes / (self.gbps * 1e3)


def machinery_us(hbm_ms: np.ndarray, hit_ms: np.ndarray) -> Estimate:
    """The cache machinery's cost per step (us): per repeat, the mean step behind a cache that every
    lookup hits minus the mean step in HBM, both (repeats, steps) ms over the same batches."""
    _same_shape(hbm_ms, hit_ms)
    return Estimate.of((hit_ms.mean(axis=1) - hbm_ms.mean(axis=1)) * 1e3)


def bandwidth_gbps(hbm_ms: np.ndarray, uvm_ms: np.ndarray, moved: np.ndarray) -> Estimate:
    """The effective bandwidth of scattered rows (GB/s): per repeat, the bytes the UVM steps moved
    (``moved``, per step) over their extra time above the same steps in HBM ((repeats, steps) ms).
    ``ValueError`` where a repeat's UVM steps were not slower."""
    _same_shape(hbm_ms, uvm_ms)
    extra = uvm_ms.mean(axis=1) - hbm_ms.mean(axis=1)
    if np.any(extra <= 0):
        raise ValueError(
            f"UVM steps were not slower than HBM's in {int((extra <= 0).sum())} of {len(extra)} repeats "
            f"(extra ms {np.round(extra, 4).tolist()})"
        )
    return Estimate.of(float(np.mean(moved)) / (extra * 1e-3) / 1e9)


def fit_miss_costs(
    excess_ms: np.ndarray, misses: np.ndarray, evicted: np.ndarray
) -> tuple[Estimate, Estimate]:
    """The cost per missed row and per evicted row (us): per repeat, the least-squares fit of the time
    steps took above the same batches' all-hit steps (``excess_ms``) on their missed and evicted rows,
    all (repeats, steps). ``ValueError`` where misses and evictions cannot be told apart."""
    _same_shape(excess_ms, misses)
    _same_shape(excess_ms, evicted)
    costs = []
    for excess, missed, out in zip(excess_ms, misses, evicted, strict=True):
        design = np.stack([missed, out], axis=1).astype(np.float64)
        if np.linalg.matrix_rank(design) < 2:
            raise ValueError(
                "missed and evicted rows are proportional over the steps: their costs cannot be told apart "
                "(the steps need misses into empty ways as well as misses that evict)"
            )
        costs.append(np.linalg.lstsq(design, excess * 1e3, rcond=None)[0])
    miss, evict = np.array(costs).T
    return Estimate.of(miss), Estimate.of(evict)


def fit_collective(sizes: list[int], us: list[float]) -> Collective:
    """A collective's latency and bandwidth: the least-squares line through its time at each payload
    size. ``ValueError`` with fewer than two sizes, or where time does not grow with size."""
    x, y = np.asarray(sizes, dtype=np.float64), np.asarray(us, dtype=np.float64)
    if len(np.unique(x)) < 2:
        raise ValueError(f"a collective needs at least two payload sizes, got {sizes}")
    slope, latency = np.polyfit(x, y, 1)
    if slope <= 0:
        raise ValueError(f"time does not grow with size (us {np.round(y, 1).tolist()} at bytes {sizes})")
    return Collective(float(latency), float(1e-3 / slope), [int(s) for s in sizes], [float(t) for t in us])


def _same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if np.shape(a) != np.shape(b):
        raise ValueError(f"timings of different shapes: {np.shape(a)} and {np.shape(b)}")


@dataclass(frozen=True)
class Calibration:
    """What ``bench_calibrate.py`` measured on a GPU with FBGEMM, by row bytes: the effective host-device
    bandwidth of scattered rows (GB/s, in the busier direction), the cache machinery's cost per cache and
    step (us), and the cost per missed and per evicted row above an all-hit step (us); with several GPUs,
    the collectives of table-wise, row-wise and data-parallel layouts."""

    device: str
    bandwidth_gbps: dict[int, Estimate]
    machinery_us: dict[int, Estimate]
    miss_us: dict[int, Estimate]
    evict_us: dict[int, Estimate]
    world_size: int = 1
    collectives: dict[str, Collective] = field(default_factory=dict)

    def bandwidth_at(self, row_bytes: int) -> float:
        """The median bandwidth (GB/s) for rows of ``row_bytes``, interpolated in log row bytes (the
        nearest measured size outside the measured range)."""
        return _interpolate(self.bandwidth_gbps, row_bytes)

    def machinery_at(self, row_bytes: int) -> float:
        """The median machinery cost (us) for rows of ``row_bytes``, as ``bandwidth_at``."""
        return _interpolate(self.machinery_us, row_bytes)

    def terms(self, row_bytes: int) -> Terms:
        """The traffic model at PCIe Gen4 for rows of ``row_bytes``: the bandwidth as a share of Gen4's
        theoretical one, and the machinery cost."""
        return Terms(
            machinery_ms=self.machinery_at(row_bytes) / 1e3,
            bandwidth_share=self.bandwidth_at(row_bytes) * 1e9 / PCIE["Gen4"],
        )

    def describe(self) -> str:
        """The figures, one row size a line, then the collectives."""
        lines = [f"calibrated on {self.device} (bench_calibrate.py; median [lowest, highest repeat]):"]
        for size in sorted(self.bandwidth_gbps):
            lines.append(
                f"  {size:>5} B rows: effective host-device bandwidth {self.bandwidth_gbps[size]} GB/s, "
                f"cache machinery {self.machinery_us[size]} us per cache and step, {self.miss_us[size]} "
                f"us per missed row, {self.evict_us[size]} us per evicted row"
            )
        if not self.collectives:
            lines.append(f"  collectives: not measured (world size {self.world_size})")
        for name, collective in self.collectives.items():
            lines.append(
                f"  {name} at world size {self.world_size}: {collective.latency_us:.1f} us + bytes / "
                f"{collective.gbps:.1f} GB/s"
            )
        return "\n".join(lines)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """The figures a calibration wrote; ``ValueError`` naming the file, and the field where one is
        missing or not a number of the right sign. Files of the older format (``effective_gbps``: one
        bandwidth for every row size, the machinery clamped at 0) are refused by that name."""
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a calibration written by bench_calibrate.py ({error})") from error
        if not isinstance(saved, dict):
            raise ValueError(f"{path}: not a calibration written by bench_calibrate.py (not an object)")
        if "effective_gbps" in saved:
            raise ValueError(
                f"{path}: effective_gbps is the older format (one bandwidth for every row size, the "
                "machinery timed on a repeated batch and clamped at 0); run bench_calibrate.py again"
            )
        names = {f.name for f in fields(cls)}
        missing = sorted(names - {"world_size", "collectives"} - set(saved))
        if missing or set(saved) - names:
            raise ValueError(
                f"{path}: not a calibration written by bench_calibrate.py (missing {missing}, unknown "
                f"{sorted(set(saved) - names)})"
            )
        try:
            calibration = cls(
                device=str(saved["device"]),
                **{name: _by_row_bytes(saved[name], name) for name in ROW_FIGURES},
                world_size=saved.get("world_size", 1),
                collectives={
                    name: _collective(figures, name) for name, figures in saved.get("collectives", {}).items()
                },
            )
            calibration._check()
        except (TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path}: {error}") from error
        return calibration

    def _check(self) -> None:
        """``ValueError`` naming the field where a figure is not usable."""
        sizes = set(self.bandwidth_gbps)
        if not sizes:
            raise ValueError("bandwidth_gbps has no row size")
        for name in ROW_FIGURES:
            if set(getattr(self, name)) != sizes:
                raise ValueError(
                    f"{name} has row sizes {sorted(getattr(self, name))}, bandwidth_gbps {sorted(sizes)}"
                )
        for size, estimate in self.bandwidth_gbps.items():
            if not estimate.low > 0:
                raise ValueError(
                    f"bandwidth_gbps at {size} B must be positive in every repeat, got {estimate}"
                )
        for size, estimate in self.machinery_us.items():
            if not estimate.sign_known:
                raise ValueError(
                    f"machinery_us at {size} B has repeats of either sign ({estimate}): sign unknown"
                )
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {self.world_size!r}")
        for name, collective in self.collectives.items():
            if not collective.gbps > 0:
                raise ValueError(f"collectives.{name}.gbps must be positive, got {collective.gbps}")


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _by_row_bytes(saved: dict, name: str) -> dict[int, Estimate]:
    """Estimates keyed by row bytes as JSON wrote them (keys as strings)."""
    if not isinstance(saved, dict):
        raise ValueError(f"{name} must map row bytes to estimates, got {saved!r}")
    estimates = {}
    for key, figures in saved.items():
        if not str(key).isdigit() or int(key) < 1:
            raise ValueError(f"{name} has a row size {key!r} that is not a positive integer")
        if not isinstance(figures, dict) or set(figures) != {"median", "low", "high"}:
            raise ValueError(f"{name} at {key} B must have median, low and high, got {figures!r}")
        values = [_number(figures[k], f"{name} at {key} B: {k}") for k in ("median", "low", "high")]
        if not values[1] <= values[0] <= values[2]:
            raise ValueError(f"{name} at {key} B: median {values[0]} is not between low and high")
        estimates[int(key)] = Estimate(*values)
    return estimates


def _collective(figures: dict, name: str) -> Collective:
    collective = Collective(**figures)
    _number(collective.latency_us, f"collectives.{name}.latency_us")
    _number(collective.gbps, f"collectives.{name}.gbps")
    return collective


def _interpolate(estimates: dict[int, Estimate], row_bytes: int) -> float:
    sizes = sorted(estimates)
    return float(np.interp(np.log(row_bytes), np.log(sizes), [estimates[s].median for s in sizes]))
