"""Checkpoint and resume mid-epoch: model, fused and unfused optimizer state, and where to resume.

``Checkpoints`` keeps one run's checkpoints in a directory: ``step-NNNNNNNNN/rank{r}.pt`` holds the
shards rank ``r`` has, and ``rank{r}.json`` beside it a manifest: the file's SHA-256 and size, the step,
the run, the world size, the run's configuration and the plan's layout. A new checkpoint goes into its
own folder, and a rank deletes its older ones only after every rank has written the new one, so a
crash in the middle of a save leaves the previous checkpoint whole. Resuming takes the newest step
that every rank holds, and refuses, naming the file or option, a damaged file, another run, another
world size, configuration or plan: nothing is loaded silently.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.cold_tier import PlannedColdTier, check_cold_tier

logger = logging.getLogger(__name__)

#: Manifest format; a manifest of another format is refused.
FORMAT = 1
#: What a manifest holds.
MANIFEST_KEYS = frozenset(
    {"format", "step", "run", "rank", "world_size", "sha256", "bytes", "config", "plan"}
)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: missing, damaged, or of another run or setup."""


def plan_layout(plan: ShardingPlan) -> dict[str, str]:
    """Per sharded parameter (``module.param``), its sharding type, kernel, ranks and shards: what a
    checkpoint's shards depend on."""
    layout = {}
    for module, module_plan in plan.plan.items():
        for name, sharding in module_plan.items():
            spec = sharding.sharding_spec
            shards = [
                f"{list(s.shard_offsets)}+{list(s.shard_sizes)}" for s in getattr(spec, "shards", None) or []
            ]
            layout[f"{module}.{name}"] = (
                f"{sharding.sharding_type}/{sharding.compute_kernel} ranks {sharding.ranks} "
                f"shards {' '.join(shards)}"
            )
    return dict(sorted(layout.items()))


class Checkpoints:
    """The checkpoints of one training run in ``directory`` (every method is a collective; making one
    is not: the ranks agree on the run's id at its first ``save`` or ``load``).

    ``config`` holds what a resume must share with the run that saved (JSON values keyed by a name the
    user knows, such as ``--batch-size``); ``plan`` is the model's ``ShardingPlan``.
    """

    def __init__(
        self, directory: str | os.PathLike, config: Mapping[str, Any], plan: ShardingPlan | None = None
    ) -> None:
        self.directory = Path(directory)
        self.config = json.loads(json.dumps(dict(config)))  # as it reads back from a manifest
        self.layout = plan_layout(plan) if plan is not None else {}
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        #: The run's id in the manifests: a fresh one made on rank 0 at the first save, or the resumed run's.
        self.run_id: str | None = None

    def for_plan(self, plan: ShardingPlan) -> Checkpoints:
        """These checkpoints (the same run and directory) of a model sharded by ``plan`` from now on,
        such as after a re-plan: later saves record its layout, a resume from them must plan it."""
        moved = copy.copy(self)
        moved.layout = plan_layout(plan)
        return moved

    def save(
        self,
        step: int,
        model: DistributedModelParallel,
        unfused_optimizer: torch.optim.Optimizer,
        position: Mapping[str, Any],
        summary: Mapping[str, Any] | None = None,
        *,
        cold_tier: PlannedColdTier | None = None,
    ) -> Path:
        """Write this rank's shards at ``step``; once every rank has, drop the older checkpoints.
        ``position`` says where to resume (a router's ``state_dict``, counters); ``summary`` (JSON
        values) goes into the manifests, for :meth:`peek` to read before the model is built (what a
        resume must build it from); returns the folder. A model with a planned cold tier saves the
        tier's state too (its host rows live outside the model)."""
        check_cold_tier(model, cold_tier)
        if self.run_id is None:
            run = [uuid.uuid4().hex]
            dist.broadcast_object_list(run, src=0)
            self.run_id = run[0]
        runs = {m["run"] for m in map(self._manifest, self._steps()) if "damaged" not in m}
        _raise_on_every_rank(
            f"{self.directory} holds checkpoints of another run: resume from them, or checkpoint into an "
            "empty directory"
            if runs - {self.run_id}
            else None
        )
        error = None
        try:
            self._write(step, model, unfused_optimizer, position, summary, cold_tier)
        except OSError as failure:
            error = f"rank {self.rank} could not write its checkpoint: {failure}"
        _raise_on_every_rank(error)  # every rank holds the new checkpoint: the older ones may go
        for older in self._steps():
            if older < step:
                self._remove(older)
        return self._folder(step)

    def held_steps(self) -> list[int]:
        """The steps any rank holds a checkpoint of (such as an earlier run's), oldest first."""
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, self._steps())
        return sorted(set().union(*everyone))

    def _write(
        self,
        step: int,
        model: DistributedModelParallel,
        unfused_optimizer: torch.optim.Optimizer,
        position: Mapping[str, Any],
        summary: Mapping[str, Any] | None,
        cold_tier: PlannedColdTier | None,
    ) -> None:
        """This rank's files of ``step``: the state, then the manifest that vouches for it."""
        folder = self._folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        # a manifest left by an interrupted earlier save must never describe the new file
        (folder / f"rank{self.rank}.json").unlink(missing_ok=True)
        buffer = io.BytesIO()
        torch.save(
            {
                "model": _local(model.state_dict()),
                "fused_optimizer": _local(model.fused_optimizer.state_dict()),
                "unfused_optimizer": unfused_optimizer.state_dict(),
                "position": dict(position),
                "cold_tier": None if cold_tier is None else cold_tier.state_dict(),
            },
            buffer,
        )
        data = buffer.getvalue()
        manifest = {
            "format": FORMAT,
            "step": step,
            "run": self.run_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "config": self.config,
            "plan": self.layout,
            "summary": dict(summary or {}),
        }
        _write_atomically(folder / f"rank{self.rank}.pt", data)
        _write_atomically(folder / f"rank{self.rank}.json", json.dumps(manifest, indent=1).encode())

    def load(
        self,
        model: DistributedModelParallel,
        unfused_optimizer: torch.optim.Optimizer,
        *,
        cold_tier: PlannedColdTier | None = None,
    ) -> dict:
        """Restore the newest checkpoint every rank holds (and the model's planned cold tier); return its
        position.

        Raises ``CheckpointError`` naming the file, rank or option when there is none, a file is
        damaged, or the checkpoint is of another run, world size, configuration or plan.
        """
        step, manifests = self._resumed()
        self._check(manifests, step)
        self._check_plan(manifests, step)
        check_cold_tier(model, cold_tier)
        error, state = None, None
        try:
            state = self._read(step, manifests[self.rank])
            if (state.get("cold_tier") is None) != (cold_tier is None):
                raise CheckpointError(
                    f"{self._folder(step) / f'rank{self.rank}.pt'}: saved "
                    f"{'without' if cold_tier is not None else 'with'} a planned cold tier"
                )
            if cold_tier is not None:
                cold_tier.load_state_dict(state["cold_tier"])
        except (CheckpointError, ValueError) as failure:
            error = str(failure)
        _raise_on_every_rank(error)
        with torch.no_grad():
            where = str(self._folder(step) / f"rank{self.rank}.pt")
            _restore(model.state_dict(), state["model"], where)
            fused = model.fused_optimizer.state_dict()
            _restore(fused, state["fused_optimizer"], where)
            model.fused_optimizer.load_state_dict(fused)
        unfused_optimizer.load_state_dict(state["unfused_optimizer"])
        self.run_id = manifests[0]["run"]  # later saves continue that run
        for newer in self._steps():  # what an interrupted save left: the run will write it again
            if newer > step:
                self._remove(newer)
        return state["position"]

    def peek(self) -> tuple[int, dict]:
        """The step :meth:`load` would resume from and the summary saved with it (``{}`` when none),
        read from the manifests alone: what the model must be built from before it loads. Raises
        ``CheckpointError`` as :meth:`load` does for what it refuses but another plan (no checkpoint,
        damaged manifests, another run, world size or configuration), so that a resume that cannot
        go on stops before the model is built (collective)."""
        step, manifests = self._resumed()
        self._check(manifests, step)
        return step, manifests[0].get("summary", {})

    def _resumed(self) -> tuple[int, list[dict]]:
        """The newest step every rank holds, and every rank's manifest of it (collective)."""
        mine = {step: self._manifest(step) for step in self._steps()}
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine)
        step = self._common_step(everyone)
        return step, [held[step] for held in everyone]

    def _folder(self, step: int) -> Path:
        return self.directory / f"step-{step:09d}"

    def _steps(self) -> list[int]:
        """Steps this rank has a manifest for, oldest first."""
        if not self.directory.is_dir():
            return []
        steps = []
        for folder in self.directory.glob("step-*"):
            suffix = folder.name.removeprefix("step-")
            if suffix.isdigit() and (folder / f"rank{self.rank}.json").is_file():
                steps.append(int(suffix))
        return sorted(steps)

    def _manifest(self, step: int) -> dict:
        path = self._folder(step) / f"rank{self.rank}.json"
        try:
            manifest = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return {"damaged": f"{path}: damaged manifest ({error})"}
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return {"damaged": f"{path}: not a manifest of format {FORMAT}"}
        missing = sorted(MANIFEST_KEYS - set(manifest))
        if missing:
            return {"damaged": f"{path}: damaged manifest (no {missing[0]!r})"}
        if manifest["step"] != step:
            return {"damaged": f"{path}: damaged manifest (step {manifest['step']!r} in another folder)"}
        return manifest

    def _common_step(self, everyone: list[dict]) -> int:
        """The newest step every rank holds (falling back, with a warning, past a save that not every
        rank finished)."""
        if not any(everyone):
            raise CheckpointError(f"{self.directory}: no checkpoint to resume from")
        newest = max(max(held) for held in everyone if held)
        writer = next(held[newest] for held in everyone if newest in held)
        if "damaged" not in writer and writer["world_size"] != self.world_size:
            raise CheckpointError(
                f"{self._folder(newest)}: written by {writer['world_size']} rank(s), this run has "
                f"{self.world_size}; resume with {writer['world_size']} rank(s) (the shards follow the plan "
                "of that world size)"
            )
        common = set.intersection(*(set(held) for held in everyone))
        if not common:
            held = "; ".join(f"rank {r}: {sorted(h) or 'none'}" for r, h in enumerate(everyone))
            raise CheckpointError(f"{self.directory}: no step is checkpointed on every rank ({held})")
        step = max(common)
        if step < newest:
            logger.warning(
                "%s: step %d was not saved by every rank (a save was interrupted); resuming from step %d",
                self.directory, newest, step,
            )  # fmt: skip
        return step

    def _check(self, manifests: list[dict], step: int) -> None:
        """Refuse manifests that are damaged, of another run, world size or configuration."""
        folder = self._folder(step)
        for rank, manifest in enumerate(manifests):
            if "damaged" in manifest:
                raise CheckpointError(manifest["damaged"])
            if manifest["rank"] != rank or manifest["world_size"] != self.world_size:
                raise CheckpointError(
                    f"{folder}/rank{rank}.json: written by rank {manifest['rank']} of "
                    f"{manifest['world_size']}, this is rank {rank} of {self.world_size}"
                )
        runs = {m["run"] for m in manifests}
        if len(runs) > 1:
            raise CheckpointError(f"{folder}: the ranks' files come from {len(runs)} different runs")
        saved = manifests[0]["config"]
        key = _first_difference(saved, self.config)
        if key is not None:
            raise CheckpointError(
                f"{key}: the checkpoint in {folder} was written with {saved.get(key)!r}, this run has "
                f"{self.config.get(key)!r}; resume with the same value or use another checkpoint directory"
            )

    def _check_plan(self, manifests: list[dict], step: int) -> None:
        """Refuse manifests of another plan."""
        folder = self._folder(step)
        saved = manifests[0]["plan"]
        name = _first_difference(saved, self.layout)
        if name is not None:
            raise CheckpointError(
                f"{folder}: {name} was sharded as {saved.get(name)!r}, this run's plan has "
                f"{self.layout.get(name)!r}"
            )

    def _read(self, step: int, manifest: dict) -> dict:
        """This rank's state at ``step``, checked against its manifest's size and checksum."""
        path = self._folder(step) / f"rank{self.rank}.pt"
        try:
            data = path.read_bytes()
        except OSError as error:
            raise CheckpointError(f"{path}: cannot be read ({error})") from error
        if len(data) != manifest["bytes"]:
            raise CheckpointError(
                f"{path}: damaged (truncated or overwritten): {len(data)} bytes, {manifest['bytes']} saved"
            )
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise CheckpointError(f"{path}: damaged: its SHA-256 differs from the one saved with it")
        try:
            return torch.load(io.BytesIO(data), weights_only=False)
        except Exception as error:  # whatever torch raises, the file is unusable
            raise CheckpointError(f"{path}: damaged, it does not load ({error})") from error

    def _remove(self, step: int) -> None:
        """Delete this rank's files of ``step`` (and the folder once no rank has files in it)."""
        folder = self._folder(step)
        try:
            for suffix in ("json", "pt"):  # the manifest first: a file without one is never resumed
                (folder / f"rank{self.rank}.{suffix}").unlink(missing_ok=True)
        except OSError as error:  # a leftover never stops training; a later save tries again
            logger.warning("%s: could not remove rank %d's files (%s)", folder, self.rank, error)
        with contextlib.suppress(OSError):  # other ranks' files are still there, or it is gone
            folder.rmdir()


def _first_difference(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """The first key (in sorted order) whose value differs between the two, or None."""
    return next((k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)), None)


def _raise_on_every_rank(error: str | None) -> None:
    """A collective: raise ``CheckpointError`` on every rank when any rank has an ``error``, so that no
    rank goes on to a collective the others never reach."""
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [e for e in errors if e]
    if failed:
        raise CheckpointError(failed[0])


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a temporary file beside it, then renamed.
    A failed write (a full disk, a file size limit) removes the partial file and raises ``OSError``
    naming the file (``path``, or the temporary one where that could not be made)."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):  # not a file of this write (a folder in its way): left alone
            temporary.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, error.filename or str(path)) from error


def _local(value: Any) -> Any:
    """``value`` with every ``ShardedTensor`` replaced by copies of this rank's shards."""
    if isinstance(value, ShardedTensor):
        return [shard.tensor.detach().cpu().clone() for shard in value.local_shards()]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _local(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_local(item) for item in value)
    return value


def _restore(current: Any, saved: Any, where: str, name: str = "") -> None:
    """Copy ``saved`` (from :func:`_local`) into the tensors of ``current`` in place."""
    if isinstance(current, ShardedTensor):
        shards = current.local_shards()
        if len(shards) != len(saved):
            raise CheckpointError(f"{where}: {name} has {len(saved)} saved shards, the model {len(shards)}")
        for shard, tensor in zip(shards, saved, strict=True):
            shard.tensor.copy_(tensor)
    elif isinstance(current, torch.Tensor):
        current.copy_(saved)
    elif isinstance(current, dict):
        missing = sorted(set(current) - set(saved), key=str)
        if missing:
            raise CheckpointError(f"{where}: no saved state for {name}{missing[0]}")
        for key, item in current.items():
            _restore(item, saved[key], where, f"{name}{key}.")
    elif isinstance(current, list | tuple):
        for index, item in enumerate(current):
            _restore(item, saved[index], where, f"{name}{index}.")
