"""Checkpoint and resume mid-epoch: model, fused and unfused optimizer state, and where to resume.

``Checkpoints`` keeps one run's checkpoints in a directory: ``step-NNNNNNNNN/rank{r}.pt`` holds the
shards rank ``r`` has, and ``rank{r}.json`` beside it a manifest: the file's SHA-256 and size, the step,
the run, the world size, the run's configuration and the plan's layout. A new checkpoint goes into its
own folder, and a rank deletes its older ones only after every rank has written the new one, so a
crash in the middle of a save leaves the previous checkpoint whole. Resuming takes the newest step
that every rank holds, and refuses, naming the file or option, a damaged file, another run, another
world size, configuration or plan: nothing is loaded silently.

A rank's file streams its tensors, so that saving and loading hold no second copy of a table: the state's
structure comes first (``torch.save`` of it, each tensor replaced by its place in the file), then every
tensor's bytes, written from the tensor itself and read back into the model's own tensors (and a planned
cold tier's host rows) ``CHUNK_BYTES`` at a time. A load checks the file's size and SHA-256, reading it a
chunk at a time, before it reads anything into the model.
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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from fae_torchrec.collectives import all_gathered, raise_on_every_rank
from fae_torchrec.torchrec_compat import ShardedTensor
from fae_torchrec.train.cold_tier import PlannedColdTier, check_cold_tier

logger = logging.getLogger(__name__)

#: Manifest format; a manifest of another format is refused. 2: the streamed file (1: one ``torch.save``).
FORMAT = 2
#: What a rank's file starts with.
MAGIC = b"FAE-CKPT"
#: Bytes of a tensor written or read at a time: what a save or load holds beyond the model's own tensors
#: (on CUDA, a chunk's copy in host memory).
CHUNK_BYTES = 16 << 20
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
        raise_on_every_rank(
            f"{self.directory} holds checkpoints of another run: resume from them, or checkpoint into an "
            "empty directory"
            if runs - {self.run_id}
            else None,
            CheckpointError,
        )
        error = None
        try:
            self._write(step, model, unfused_optimizer, position, summary, cold_tier)
        except OSError as failure:
            error = f"rank {self.rank} could not write its checkpoint: {failure}"
        # every rank holds the new checkpoint: the older ones may go
        raise_on_every_rank(error, CheckpointError)
        for older in self._steps():
            if older < step:
                self._remove(older)
        return self._folder(step)

    def held_steps(self) -> list[int]:
        """The steps any rank holds a checkpoint of (such as an earlier run's), oldest first."""
        everyone = all_gathered(self._steps())
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
        state = {
            "model": model.state_dict(),
            "fused_optimizer": model.fused_optimizer.state_dict(),
            "unfused_optimizer": unfused_optimizer.state_dict(),
            "position": dict(position),
            "cold_tier": None if cold_tier is None else cold_tier.state_dict(),
        }
        digest, size = _write_atomically(folder / f"rank{self.rank}.pt", _streamed(state))
        manifest = {
            "format": FORMAT,
            "step": step,
            "run": self.run_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "sha256": digest,
            "bytes": size,
            "config": self.config,
            "plan": self.layout,
            "summary": dict(summary or {}),
        }
        _write_atomically(folder / f"rank{self.rank}.json", [json.dumps(manifest, indent=1).encode()])

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
        path = self._folder(step) / f"rank{self.rank}.pt"
        error, reader = None, None
        try:
            reader = _Reader(path, manifests[self.rank])
            if (reader.state.get("cold_tier") is None) != (cold_tier is None):
                raise CheckpointError(
                    f"{path}: saved {'without' if cold_tier is not None else 'with'} a planned cold tier"
                )
            if cold_tier is not None:
                _load_cold_tier(cold_tier, reader)
        except (CheckpointError, ValueError) as failure:
            error = str(failure)
        try:
            raise_on_every_rank(error, CheckpointError)
            assert reader is not None  # no rank failed: each opened its file
            state = reader.state
            with torch.no_grad():
                _restore(model.state_dict(), state["model"], reader)
                fused = model.fused_optimizer.state_dict()
                _restore(fused, state["fused_optimizer"], reader)
                model.fused_optimizer.load_state_dict(fused)
            unfused_optimizer.load_state_dict(reader.materialized(state["unfused_optimizer"]))
            position = reader.materialized(state["position"])
        finally:
            if reader is not None:
                reader.close()
        self.run_id = manifests[0]["run"]  # later saves continue that run
        for newer in self._steps():  # what an interrupted save left: the run will write it again
            if newer > step:
                self._remove(newer)
        return position

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
        everyone = all_gathered(mine)
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


def _write_atomically(path: Path, chunks: Iterable[bytes | np.ndarray]) -> tuple[str, int]:
    """Write ``chunks`` to ``path`` whole or not at all: into a temporary file beside it, then renamed;
    return the file's SHA-256 and size. A failed write (a full disk, a file size limit) removes the
    partial file and raises ``OSError`` naming the file (``path``, or the temporary one where that could
    not be made); an error making the chunks removes it too and is raised as it is."""
    temporary = path.with_name(path.name + ".tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with open(temporary, "wb") as file:
            for chunk in chunks:
                view = memoryview(chunk) if isinstance(chunk, bytes) else chunk.data
                file.write(view)
                digest.update(view)
                size += view.nbytes
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(path)
    except BaseException as error:  # a failed write, or a chunk that could not be made
        with contextlib.suppress(OSError):  # not a file of this write (a folder in its way): left alone
            temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, error.filename or str(path)) from error
        raise
    return digest.hexdigest(), size


@dataclass(frozen=True)
class _Stored:
    """Where a tensor's bytes are in a rank's file (``offset`` from the first tensor's), and what it is."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class _Tensors:
    """A state's tensors in the order of the file, and where the next one starts."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.end = 0

    def stored(self, tensor: torch.Tensor) -> _Stored:
        """``tensor`` appended, and its place."""
        place = _Stored(self.end, tensor.dtype, tuple(tensor.shape))
        self.tensors.append(tensor)
        self.end += tensor.numel() * tensor.element_size()
        return place

    def skeleton(self, value: Any) -> Any:
        """``value`` with each tensor replaced by its place (a ``ShardedTensor`` by the list of this rank's
        shards')."""
        if isinstance(value, ShardedTensor):
            return [self.stored(shard.tensor) for shard in value.local_shards()]
        if isinstance(value, torch.Tensor):
            return self.stored(value)
        if isinstance(value, dict):
            return {key: self.skeleton(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.skeleton(item) for item in value)
        return value


def _streamed(state: Mapping[str, Any]) -> Iterator[bytes | np.ndarray]:
    """A rank's file of ``state``, chunk by chunk: ``MAGIC``, the structure's length and the structure
    (``torch.save``, tensors replaced by their places), then each tensor's bytes from the tensor itself."""
    tensors = _Tensors()
    structure = io.BytesIO()
    torch.save(tensors.skeleton(state), structure)
    yield MAGIC
    yield structure.getbuffer().nbytes.to_bytes(8, "little")
    yield structure.getvalue()
    for tensor in tensors.tensors:
        for block in _blocks(tensor.detach()):
            yield _bytes_of(block.contiguous()).cpu().numpy()


def _blocks(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` in blocks of leading rows of at most ``CHUNK_BYTES`` (at least a row each; a scalar
    whole), views of it."""
    if tensor.dim() == 0 or not tensor.numel():
        return [tensor.reshape(-1)]
    row_bytes = max(tensor[0].numel() * tensor.element_size(), 1)
    return list(tensor.split(max(CHUNK_BYTES // row_bytes, 1)))


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous ``tensor``'s bytes, as a flat uint8 view of it."""
    return tensor.reshape(-1).view(torch.uint8)


class _Reader:
    """A rank's file at ``path``, its size and SHA-256 checked against ``manifest`` a chunk at a time; its
    structure read (``state``); its tensors read on demand into given tensors or new ones."""

    def __init__(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self.path = path
        self._check(manifest)
        self._file = open(path, "rb")  # closed by ``close``: the reads span the load
        try:
            if self._file.read(len(MAGIC)) != MAGIC:
                raise CheckpointError(f"{path}: not a checkpoint of format {FORMAT}")
            length = int.from_bytes(self._file.read(8), "little")
            self.state = torch.load(io.BytesIO(self._file.read(length)), weights_only=False)
            self._start = len(MAGIC) + 8 + length
        except CheckpointError:
            self.close()
            raise
        except Exception as error:  # whatever torch raises, the file is unusable
            self.close()
            raise CheckpointError(f"{path}: damaged, it does not load ({error})") from error

    def _check(self, manifest: Mapping[str, Any]) -> None:
        try:
            size = self.path.stat().st_size
            if size != manifest["bytes"]:
                saved = manifest["bytes"]
                raise CheckpointError(
                    f"{self.path}: damaged (truncated or overwritten): {size} bytes, {saved} saved"
                )
            digest, chunk = hashlib.sha256(), bytearray(CHUNK_BYTES)
            with open(self.path, "rb") as file:
                while read := file.readinto(chunk):
                    digest.update(memoryview(chunk)[:read])
        except OSError as error:
            raise CheckpointError(f"{self.path}: cannot be read ({error})") from error
        if digest.hexdigest() != manifest["sha256"]:
            raise CheckpointError(f"{self.path}: damaged: its SHA-256 differs from the one saved with it")

    def into(self, stored: Any, tensor: torch.Tensor, name: str) -> None:
        """Read the tensor stored at ``stored`` into ``tensor`` (of its dtype and shape), a block at a time:
        straight into it where it is contiguous host memory."""
        if not isinstance(stored, _Stored) or (stored.dtype, stored.shape) != (
            tensor.dtype,
            tuple(tensor.shape),
        ):
            what = (
                f"{stored.dtype} {list(stored.shape)}"
                if isinstance(stored, _Stored)
                else type(stored).__name__
            )
            raise CheckpointError(
                f"{self.path}: {name or 'a tensor'} is saved as {what}, the model's is "
                f"{tensor.dtype} {list(tensor.shape)}"
            )
        self._file.seek(self._start + stored.offset)
        for block in _blocks(tensor):
            direct = block.device.type == "cpu" and block.is_contiguous()
            target = block if direct else torch.empty(block.shape, dtype=block.dtype)
            view = _bytes_of(target.detach()).numpy()
            if self._file.readinto(view.data) != len(view):
                raise CheckpointError(f"{self.path}: damaged, {name or 'a tensor'} ends early")
            if not direct:
                block.copy_(target)

    def materialized(self, value: Any, name: str = "") -> Any:
        """``value`` (part of ``state``) with each stored tensor read into a new one."""
        if isinstance(value, _Stored):
            tensor = torch.empty(value.shape, dtype=value.dtype)
            self.into(value, tensor, name)
            return tensor
        if isinstance(value, dict):
            return {key: self.materialized(item, f"{name}{key}.") for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.materialized(item, f"{name}{i}.") for i, item in enumerate(value))
        return value

    def close(self) -> None:
        self._file.close()


def _load_cold_tier(cold_tier: PlannedColdTier, reader: _Reader) -> None:
    """Restore a planned cold tier from ``reader``: checked first, then its host rows read straight into
    the tier's own (no second copy of the cold rows), then the rest as ``load_state_dict`` takes it."""
    saved = reader.state["cold_tier"]
    rest = reader.materialized({**saved, "groups": [{**g, "rows": {}} for g in saved["groups"]]})
    cold_tier.check_state(rest)
    current = cold_tier.state_dict()  # its host rows are views of the tier's own
    with torch.no_grad():
        for mine, theirs in zip(current["groups"], saved["groups"], strict=True):
            _restore(mine["rows"], theirs["rows"], reader, "cold_tier.rows.")
    for mine, group in zip(current["groups"], rest["groups"], strict=True):
        group["rows"] = mine["rows"]
    cold_tier.load_state_dict(rest)


def _restore(current: Any, saved: Any, reader: _Reader, name: str = "") -> None:
    """Read ``saved`` (a skeleton of stored tensors) into the tensors of ``current`` in place."""
    where = reader.path
    if isinstance(current, ShardedTensor):
        shards = current.local_shards()
        if len(shards) != len(saved):
            raise CheckpointError(f"{where}: {name} has {len(saved)} saved shards, the model {len(shards)}")
        for shard, stored in zip(shards, saved, strict=True):
            reader.into(stored, shard.tensor, name)
    elif isinstance(current, torch.Tensor):
        reader.into(saved, current, name)
    elif isinstance(current, dict):
        missing = sorted(set(current) - set(saved), key=str)
        if missing:
            raise CheckpointError(f"{where}: no saved state for {name}{missing[0]}")
        for key, item in current.items():
            _restore(item, saved[key], reader, f"{name}{key}.")
    elif isinstance(current, list | tuple):
        for index, item in enumerate(current):
            _restore(item, saved[index], reader, f"{name}{index}.")
