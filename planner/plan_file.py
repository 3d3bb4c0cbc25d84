"""``PlanFile``: the plan ``fae-torchrec plan --out`` writes and the examples train on (``--plan``).

It holds TorchRec's ``ShardingPlan`` of the split module (an ``FAEEmbeddingBagCollection``), keyed by the
paths of its parts relative to it (``hot``, ``cold``), and what the plan was made for: the devices, the
tables, the optimizer, the batch size, the statistics file and the hot set the knob chose. A training run
places the plan at its split module's path (:meth:`PlanFile.at`) after checking that it was made for that
run (:meth:`PlanFile.mismatch`): a plan of other devices, tables or hot set would shard other modules or
place shards on ranks that do not exist.

The file is ``torch.save``'s pickle of the plan (TorchRec's own types: ``ShardingPlan``,
``ParameterSharding``): load only plan files you made.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
from torchrec.distributed.types import ShardingPlan

#: The plan file's format version.
FORMAT = 1
#: The fields of ``made_for`` a run checks, in the order it checks them (the first mismatch is reported).
CHECKED = ("device", "world_size", "dim", "tables", "optimizer", "stats", "hot_set", "prefetch_pipeline")


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of the file at ``path`` (a statistics file's identity), read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class PlanFile:
    """A plan of a split module and what it was made for.

    Attributes:
        plan: TorchRec's plan of the split module, keyed relative to it (``hot``, ``cold``).
        made_for: ``device`` (``cuda``/``cpu``), ``world_size``, ``tables`` (``TableLayout.describe``:
            names, rows, dim, features), ``dim``, ``optimizer`` (its command-line name), ``stats`` (the
            statistics file's SHA-256), ``hot_set`` (``HotSet.digest``), ``prefetch_pipeline`` (whether
            the UVM caches were planned for TorchRec's prefetch pipeline; checked on CUDA), and, not
            checked, the ``hot_bytes`` that rebuild the hot set from the statistics, ``hot_rows``,
            ``batch_size`` (a warning), ``hbm_cap``, ``cache_algorithm`` and ``stats_file`` (its path
            when planned).
    """

    plan: ShardingPlan
    made_for: dict

    def save(self, path: str | os.PathLike) -> None:
        torch.save({"format": FORMAT, "plan": self.plan, "made_for": self.made_for}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PlanFile:
        """Read a file :meth:`save` wrote; ``ValueError`` naming ``path`` for any other file."""
        try:
            content = torch.load(path, weights_only=False)
        except OSError:
            raise
        except Exception as error:  # whatever unpickling raises, the file is no plan
            raise ValueError(f"{path}: not a plan file of `fae-torchrec plan --out` ({error})") from error
        if not isinstance(content, dict) or content.get("format") != FORMAT:
            raise ValueError(f"{path}: not a plan file of `fae-torchrec plan --out` (format {FORMAT})")
        made_for = content.get("made_for")
        if (
            not isinstance(content.get("plan"), ShardingPlan)
            or not isinstance(made_for, dict)
            or set(CHECKED) - set(made_for)
        ):
            raise ValueError(f"{path}: damaged: no ShardingPlan, or not all of {list(CHECKED)}")
        return cls(content["plan"], content["made_for"])

    def mismatch(self, run: dict) -> str | None:
        """The first field of ``CHECKED`` that ``run`` has and whose value there differs from the plan's,
        said as ``"field: made for value, this run has value"``; None when none differs."""
        for field in (field for field in CHECKED if field in run):
            if _plain(self.made_for[field]) != _plain(run[field]):
                return f"{field}: {difference(self.made_for[field], run[field])}"
        return None

    def at(self, path: str) -> ShardingPlan:
        """The plan with its modules at the split module's ``path`` in a model (``""``: the root)."""
        return ShardingPlan(
            {f"{path}.{key}" if path else key: value for key, value in self.plan.plan.items()}
        )


def difference(made: object, here: object) -> str:
    """How ``here`` differs from ``made``, said as ``"made for ..., this run has ..."``: the values, or
    of two lists (such as described tables) their lengths and the first entry that differs."""
    made, here = _plain(made), _plain(here)
    if isinstance(made, list) and isinstance(here, list):
        first = next((i for i, (a, b) in enumerate(zip(made, here, strict=False)) if a != b), len(made))
        made = f"{len(made)}, at {first}: {made[first] if first < len(made) else 'none'}"
        here = f"{len(here)}, at {first}: {here[first] if first < len(here) else 'none'}"
    else:
        made, here = repr(made), repr(here)
    return f"made for {made}, this run has {here}"


def _plain(value: object) -> object:
    """``value`` with tuples as lists, so that a described layout compares equal to its saved copy."""
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
