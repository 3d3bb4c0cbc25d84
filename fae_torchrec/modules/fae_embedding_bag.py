"""``FAEEmbeddingBagCollection``: an ``EmbeddingBagCollection`` split into a hot part and a cold part.

The hot rows of table ``t`` form table ``t_hot`` of the ``hot`` EBC (ids ``0..H-1``, in original id
order); a table with cold rows keeps all its rows, at their original ids, as ``t_cold`` of the ``cold``
EBC, where a hot row's copy is not read (nor trained) while the row is hot. Cold rows thus never change
place: a re-plan writes the rows that leave the hot part into the cold part and reads those that enter
it, and the cold part is the baseline's tables (the hot rows' copies cost the hot set's bytes).

The forward takes the original ``KeyedJaggedTensor`` and remaps ids with one ``searchsorted`` over the
sorted hot ids of all tables, or takes them already split (``SplitFeatures``, made by ``split`` before
the step, e.g. by the batch router from a partition's part ids, remapped when the partition was
written), looks up both parts with SUM pooling and returns the ``KeyedTensor`` the unsplit EBC would
return (MEAN tables are divided by the bag sizes at the end). Both parts are ordinary EBCs, so
``DistributedModelParallel`` shards each with TorchRec's own sharders and kernels.

Two mistakes train silently, so the module warns once about each when it sees them in a step: a plan
that keeps hot rows out of device memory (a hot table on a UVM or key-value kernel, as TorchRec's own
planner may place a hot part on a GPU: plan with ``FAEShardingPlanner``), and a cold part pipelined by
TorchRec's own train pipeline, which starts its input distribution on hot batches too (FAE's pipelines
skip it, and say so through ``cold_input_skipped_on_hot``).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from functools import cached_property

import numpy as np
import torch
from torch.profiler import record_function
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingBagCollectionInterface
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from fae_torchrec import trace
from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.stats.hot_set import ALL_HOT, COLD, HOT, HotRowIndex, HotSet
from fae_torchrec.tables import TableLayout
from fae_torchrec.torchrec_compat import is_fx_symbolic_tracing, is_pipelined

#: The kernels that keep a table's rows in device memory (HBM on CUDA): the only ones for hot rows.
HOT_KERNELS = (EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value)
#: The kernel of a slot table (``cold_slots``): plain FBGEMM rows in device memory, no cache.
SLOT_KERNEL = EmbeddingComputeKernel.FUSED.value
#: Sharding types of a slot table: each shard holds whole rows (a slot group of a planned cold tier).
SLOT_SHARDING_TYPES = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
)


def part_table_name(table: str, part: str) -> str:
    """Name of ``table``'s share in a part (unique across both parts, as planner constraints need)."""
    return f"{table}_{part}"


def part_key(table: str, part: str) -> str:
    """The name of ``table``'s weight in ``part`` in the split module's state dict."""
    return f"{part}.embedding_bags.{part_table_name(table, part)}.weight"


class FAEEmbeddingBagCollection(EmbeddingBagCollectionInterface):
    """A drop-in for ``EmbeddingBagCollection`` whose tables are split by a ``HotSet``.

    Args:
        tables: the original table configs (SUM or MEAN pooling).
        hot_set: which rows of each table are hot (made for the same tables).
        is_weighted: whether features carry per-id weights (SUM pooling only, as in TorchRec).
        device: where the parts are created (``meta`` for planning).
        cold_slots: per table (original name) with cold rows, the slots of its cold part's table, for
            a planned cold tier (``fae_torchrec.train.cold_tier.PlannedColdTier``), which keeps the cold
            rows in host memory and copies into the slots the rows each cold step needs. None: the
            cold part's tables hold the cold rows themselves.
        cold_tables: the tables the cold part keeps (every row of each): at least those with cold rows
            (the default), more where a re-plan keeps the cold part as it is
            (``fae_torchrec.train.row_moves``). A planned cold tier's are the tables with cold rows.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        hot_set: HotSet,
        is_weighted: bool = False,
        device: torch.device | None = None,
        cold_slots: Mapping[str, int] | None = None,
        cold_tables: Collection[str] | None = None,
    ) -> None:
        super().__init__()
        layout = TableLayout.of(tables)
        _check_tables(tables, layout, hot_set, is_weighted)
        self._configs = list(tables)
        self._layout = layout
        self._is_weighted = is_weighted
        num_hot = np.array([len(ids) for ids in hot_set.hot_ids], dtype=np.int64)
        self._num_hot = num_hot.tolist()
        #: Per table, its cold rows (those of the cold part, or of a planned cold tier's host memory).
        self.num_cold = dict(zip(layout.names, (layout.num_rows - num_hot).tolist(), strict=True))
        slots = None if cold_slots is None else _checked_slots(cold_slots, self.num_cold)
        kept = set(slots) if slots is not None else _checked_cold_tables(cold_tables, self.num_cold)
        #: Per table of the cold part, its rows there (or in a planned cold tier's host memory): all.
        self.cold_rows = {c.name: c.num_embeddings for c in tables if c.name in kept}
        self.cold_slots = slots
        cold_sizes = self.cold_rows if slots is None else slots
        sizes = {HOT: num_hot, COLD: np.array([cold_sizes.get(t, 0) for t in layout.names], dtype=np.int64)}
        #: Per part weight (its name in this module's state dict), its table.
        self.part_tables = {
            part_key(t, part): t
            for part, rows in sizes.items()
            for t, n in zip(layout.names, rows, strict=True)
            if n > 0
        }
        self.hot = self._make_part(HOT, sizes[HOT], device)
        self.cold = self._make_part(COLD, sizes[COLD], device)
        features = layout.features
        self._part_keys: dict[str, list[int]] = {
            part: [
                features.index(f)
                for c, n in zip(tables, sizes[part], strict=True)
                if n > 0
                for f in c.feature_names
            ]
            for part in sizes
        }
        self._part_key_names: dict[str, list[str]] = {
            part: [features[i] for i in keys] for part, keys in self._part_keys.items()
        }
        self._dims = {f: c.embedding_dim for c in tables for f in c.feature_names}
        self._mean_features = {f for c in tables if c.pooling == PoolingType.MEAN for f in c.feature_names}
        self._register_index(hot_set, layout)
        #: Set by FAE's train pipelines, which leave the cold part out of a hot batch's input distribution;
        #: a cold part pipelined while it is False (by TorchRec's own pipeline) is warned about.
        self.cold_input_skipped_on_hot = False
        self._checked: set[str] = set()  # the checks done ("plan", "pipeline"): each is made once

    def _register_index(self, hot_set: HotSet, layout: TableLayout) -> None:
        """The remap's index (``HotRowIndex``) as buffers: they move with the module and its state holds
        them."""
        index = HotRowIndex.of(hot_set)
        self.register_buffer("hot_rows", index.hot_rows)
        self.register_buffer("row_offsets", index.row_offsets)
        self.register_buffer("hot_offsets", index.hot_offsets)
        self.register_buffer("table_kind", index.table_kind, persistent=False)
        table_of_feature = [layout.table_of(f) for f in layout.features]
        self.register_buffer("table_of_feature", torch.tensor(table_of_feature), persistent=False)

    def _make_part(
        self, part: str, sizes: np.ndarray, device: torch.device | None
    ) -> EmbeddingBagCollection | None:
        configs = [
            replace(c, name=part_table_name(c.name, part), num_embeddings=int(n), pooling=PoolingType.SUM)
            for c, n in zip(self._configs, sizes, strict=True)
            if n > 0
        ]
        if not configs:
            return None
        return EmbeddingBagCollection(configs, is_weighted=self._is_weighted, device=device)

    @classmethod
    def from_ebc(cls, ebc: EmbeddingBagCollection, hot_set: HotSet) -> FAEEmbeddingBagCollection:
        """The split of a (trained) EBC: each row's weights copied into its part."""
        split = cls(ebc.embedding_bag_configs(), hot_set, ebc.is_weighted(), device=ebc.device)
        split.load_ebc_state_dict(ebc.state_dict())
        return split

    def load_ebc_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load weights given in the original layout (a plain EBC's ``state_dict``)."""
        self._check_rows_held("load_ebc_state_dict")
        with torch.no_grad():
            parts = self.split_state(state_dict)
            for _, pieces in self._pieces():
                for _, part_weight, name in pieces:
                    part_weight.copy_(parts[name].to(part_weight.device))

    def split_state(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row tensors of the original tables (keyed as a plain EBC's weights, any shape after
        the rows: weights, or an optimizer's per-row state) split as this module's parts hold them,
        keyed as the parts' weights in this module's state dict; the inverse of ``ebc_state_dict``."""
        parts = {}
        for config, pieces in self._pieces():
            full = state[f"embedding_bags.{config.name}.weight"]
            for ids, _, name in pieces:
                parts[name] = full.clone() if ids is None else full[ids.to(full.device)]
        return parts

    def ebc_state_dict(
        self, state: Mapping[str, torch.Tensor] | None = None, prefix: str = ""
    ) -> dict[str, torch.Tensor]:
        """The weights in the original layout: a state dict a plain EBC of the same tables loads.

        By default from this module's parameters; or from ``state``, full tensors keyed as this
        module's state dict under ``prefix`` (such as ``gather_full_state_dict`` of a DMP model), or
        any per-row tensors of the parts keyed so (an optimizer's state: any shape after the rows).
        """
        if state is None:
            self._check_rows_held("ebc_state_dict")
        result = {}
        for config, pieces in self._pieces():
            weights = [
                (ids, weight if state is None else state[f"{prefix}{name}"]) for ids, weight, name in pieces
            ]
            first = weights[0][1]
            full = torch.empty((config.num_embeddings, *first.shape[1:]), dtype=first.dtype)
            for ids, weight in weights:  # the cold part's every row first, the hot rows over their copies
                full[slice(None) if ids is None else ids] = weight.detach().cpu()
            result[f"embedding_bags.{config.name}.weight"] = full
        return result

    def row_ranges(self, table: str, start: int, stop: int) -> list[tuple[str, int, torch.Tensor]]:
        """Where rows ``start:stop`` of ``table`` (original ids) go: per part with rows of the table, the
        part weight's name in this module's state dict, the part row of the first of them and a mask of
        those it takes (consecutive part rows: both parts keep the original order). The cold part takes
        every row, hot rows' copies too. The cold rows of a module built with ``cold_slots`` are named
        so too, though a planned cold tier holds them."""
        low, is_hot = self._hot_within(table, start, stop)
        ranges = [(part_key(table, HOT), low, is_hot)] if bool(is_hot.any()) else []
        if table in self.cold_rows:
            ranges.append((part_key(table, COLD), start, torch.ones_like(is_hot)))
        return ranges

    def held_rows(self, key: str, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Of rows ``start:stop`` of the part weight ``key`` (its name in this module's state dict), those
        that hold their row's values (not a hot row's copy in the cold part): their positions among the
        rows, and their original ids (ascending)."""
        table = self.part_tables[key]
        if key.startswith(HOT):
            return torch.arange(stop - start), self._table_hot_ids[table][start:stop]
        held = ~self._hot_within(table, start, stop)[1]
        return torch.nonzero(held).flatten(), torch.arange(start, stop)[held]

    def _hot_within(self, table: str, start: int, stop: int) -> tuple[int, torch.Tensor]:
        """Of ``table``'s rows ``start:stop`` (original ids): how many hot rows precede them, and which
        are hot (a mask)."""
        hot = self._table_hot_ids[table]
        low, high = (int(i) for i in torch.searchsorted(hot, torch.tensor([start, stop])))
        is_hot = torch.zeros(stop - start, dtype=torch.bool)
        is_hot[hot[low:high] - start] = True
        return low, is_hot

    @cached_property
    def _table_hot_ids(self) -> dict[str, torch.Tensor]:
        """Per table, its hot ids."""
        return {config.name: hot for config, hot in zip(self._configs, self._hot_ids(), strict=True)}

    def _check_rows_held(self, what: str) -> None:
        """``ValueError`` for ``what``, which reads or writes cold rows in the cold part, when the cold
        part holds a planned cold tier's slots instead."""
        if self.cold_slots is not None:
            raise ValueError(
                f"{what}: the cold part holds the slots of a planned cold tier, not the cold rows; read "
                "and write those through the PlannedColdTier"
            )

    @cached_property
    def hot_set_digest(self) -> str:
        """The ``HotSet.digest`` of the split: batches of signed part ids name the hot set they were made
        with (computed when first asked: the planner's dry-run modules never are)."""
        return self.hot_set().digest

    def hot_set(self) -> HotSet:
        """The split this module was built with."""
        return HotSet(tuple(self._configs), tuple(ids.numpy() for ids in self._hot_ids()))

    def _hot_ids(self) -> list[torch.Tensor]:
        """Per table, its hot ids (original ids, ascending, on the CPU)."""
        rows = self.hot_rows.cpu()
        starts = self.hot_offsets.cpu().tolist()
        offsets = self.row_offsets.cpu().tolist()
        return [
            torch.arange(n) if kind == ALL_HOT else rows[start : start + n] - offset
            for start, n, offset, kind in zip(
                starts, self._num_hot, offsets, self.table_kind.tolist(), strict=True
            )
        ]

    def _pieces(
        self,
    ) -> list[tuple[EmbeddingBagConfig, list[tuple[torch.Tensor | None, torch.Tensor, str]]]]:
        """Per table: its config and, per part with rows of it, the cold part first, (its rows' original
        ids, None for the cold part's every row; part weight; the weight's name in this module's state
        dict)."""
        result = []
        for config, hot in zip(self._configs, self._hot_ids(), strict=True):
            parts: list[tuple[str, torch.Tensor | None]] = (
                [(COLD, None)] if config.name in self.cold_rows else []
            )
            parts += [(HOT, hot)] if len(hot) else []
            pieces = [
                (
                    ids,
                    getattr(self, part).embedding_bags[part_table_name(config.name, part)].weight,
                    part_key(config.name, part),
                )
                for part, ids in parts
            ]
            result.append((config, pieces))
        return result

    def _remap(self, features: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each id of ``features`` (original ids, table order) as its id in its part, and whether it
        is hot: one ``searchsorted`` over the sorted hot rows of all tables (``HotRowIndex``)."""
        values = features.values()
        device = values.device
        table = torch.repeat_interleave(
            self.table_of_feature.to(device), torch.tensor(features.length_per_key(), device=device)
        )
        index = HotRowIndex(self.hot_rows, self.row_offsets, self.hot_offsets, self.table_kind)
        return index.to(device).part_ids(values, table)

    def _split(
        self, features: KeyedJaggedTensor, parts: tuple[str, ...], part_ids: bool = False
    ) -> dict[str, KeyedJaggedTensor]:
        """The inputs of ``parts`` (those that exist) for ``features`` in table order, whose values
        are original ids or, with ``part_ids``, signed part ids (``HotSet.signed_part_ids``; both
        parts: ``_split_by_sign``).

        Vectorised on any device: one cumulative count of the hot ids places every id, hot ids
        first, in one scatter (the order within each part is kept); single-id bags take their
        lengths straight from the mask."""
        if part_ids and COLD in parts:
            return self._split_by_sign(features, parts)
        lengths, weights = features.lengths(), features.weights_or_none()
        ids, is_hot = (features.values(), None) if part_ids else self._remap(features)
        if COLD not in parts:
            # a hot batch is checked by its part ids' minimum: no mask of them is made
            all_hot = (len(ids) == 0 or bool(ids.min() >= 0)) if is_hot is None else bool(is_hot.all())
            if self.cold is not None and not all_hot:
                raise ValueError("a batch marked hot_only carries cold ids")
            if self.hot is None:
                return {}
            return {HOT: self._part_input(HOT, ids, lengths, weights, features.length_per_key(), features)}
        assert is_hot is not None  # ids without their part ids (those go by sign, above)
        # int32 and in place: this runs on every batch
        hot_through = torch.cumsum(is_hot, 0, dtype=torch.int32)  # hot ids up to and including each id
        num_hot = int(hot_through[-1]) if len(hot_through) else 0
        # hot ids go to their running count - 1, cold ids after all hot ones, in order
        cold_place = torch.arange(len(ids), dtype=torch.int32, device=ids.device) - hot_through
        cold_place += num_hot
        place = hot_through - 1
        place -= cold_place
        place *= is_hot
        place = (place + cold_place).long()
        ordered = torch.empty_like(ids).scatter_(0, place, ids)
        if weights is not None:
            weights = torch.empty_like(weights).scatter_(0, place, weights)
        hot_lengths = _hot_lengths(is_hot, lengths, hot_through)
        cold_ids = ordered[num_hot:]
        hot_weights, cold_weights = (
            (None, None) if weights is None else (weights[:num_hot], weights[num_hot:])
        )
        return self._part_inputs(
            parts,
            features,
            (ordered[:num_hot], hot_lengths, hot_weights),
            (cold_ids, lengths - hot_lengths, cold_weights),
        )

    def _split_by_sign(
        self, features: KeyedJaggedTensor, parts: tuple[str, ...]
    ) -> dict[str, KeyedJaggedTensor]:
        """``_split`` of signed part ids into both parts, in numpy: it runs in the data path, on the
        host, where numpy's boolean indexing gathers each part's ids in one pass (``_split``'s
        scatter, for remapped ids on any device, takes several; the whole split here costs about
        half). Raises ``ValueError`` for ids on a device: split before the batch moves there."""
        if features.values().device.type != "cpu":
            raise ValueError(
                f"a split by the sign of part ids runs on the host, before the batch moves to its device; "
                f"these ids are on {features.values().device}"
            )
        ids, lengths = features.values().numpy(), features.lengths()
        weights = features.weights_or_none()
        is_hot = ids >= 0
        hot_lengths = _hot_lengths(torch.from_numpy(is_hot), lengths)
        cold_ids = ids[~is_hot]
        np.invert(cold_ids, out=cold_ids)  # a cold id c is stored as ~c
        hot_weights = cold_weights = None
        if weights is not None:
            hot_weights, cold_weights = (torch.from_numpy(weights.numpy()[m]) for m in (is_hot, ~is_hot))
        return self._part_inputs(
            parts,
            features,
            (torch.from_numpy(ids[is_hot]), hot_lengths, hot_weights),
            (torch.from_numpy(cold_ids), lengths - hot_lengths, cold_weights),
        )

    def _part_inputs(
        self,
        parts: tuple[str, ...],
        features: KeyedJaggedTensor,
        hot: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        cold: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    ) -> dict[str, KeyedJaggedTensor]:
        """The ``KeyedJaggedTensor`` of each of ``parts`` that exists, from the ids, per-bag lengths
        and weights of the ``hot`` and ``cold`` parts of ``features``."""
        # ids per feature in each part, given to the parts' inputs: TorchRec's input distribution
        # needs them, and finding them from the lengths there costs more than the whole split here
        hot_per_feature = hot[1].view(len(self._layout.features), -1).sum(1).tolist()
        cold_per_feature = [n - h for n, h in zip(features.length_per_key(), hot_per_feature, strict=True)]
        pieces: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int]]] = {
            HOT: (*hot, hot_per_feature),
            COLD: (*cold, cold_per_feature),
        }
        return {
            part: self._part_input(part, *pieces[part], features)
            for part in parts
            if getattr(self, part) is not None
        }

    def _part_input(
        self,
        part: str,
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None,
        per_feature: list[int],
        features: KeyedJaggedTensor,
    ) -> KeyedJaggedTensor:
        """The ``KeyedJaggedTensor`` of ``part`` from its ids, per-bag lengths and ids per feature
        over all features (a feature outside the part has no id in it, so only its lengths go)."""
        keys, num_features = self._part_keys[part], len(self._layout.features)
        if len(keys) < num_features:
            lengths = lengths.view(num_features, -1)[keys].reshape(-1)
        return KeyedJaggedTensor(
            keys=self._part_key_names[part],
            values=values,
            lengths=lengths,
            weights=weights,
            stride=features.stride(),
            length_per_key=[per_feature[i] for i in keys],
        )

    def split(
        self, features: KeyedJaggedTensor, is_hot: bool | None = None, part_ids_of: str | None = None
    ) -> SplitFeatures:
        """``features`` split into the parts' inputs, for ``forward`` to take as they are: do it
        before the step, in the data path. ``features`` carries original ids, looked up here, or the
        signed part ids a partition stores (``HotSet.signed_part_ids``) of the hot set whose
        ``HotSet.digest`` is ``part_ids_of`` (``HotColdPartition.hot_set_digest``), split by sign with no
        lookup; they must be this module's (``ValueError`` otherwise: another hot set's part ids name
        other rows). With ``is_hot`` the batch must carry hot ids only (``ValueError`` otherwise) and its
        cold input holds no id; None finds out."""
        if part_ids_of is not None and part_ids_of != self.hot_set_digest:
            raise ValueError(
                f"the batch's part ids were made with another hot set (digest {part_ids_of}) than this "
                f"FAEEmbeddingBagCollection's ({self.hot_set_digest}, {sum(self._num_hot)} hot rows): they "
                "would train other rows; build the module from the hot set the partition was made with "
                "(prepare_data(...).hot_set), or partition the data again for this module's"
            )
        with record_function(trace.SPLIT):
            ordered = self._ordered(features)
            parts = self._split(ordered, (HOT,) if is_hot else (HOT, COLD), part_ids_of is not None)
            cold = parts.get(COLD)
            if is_hot is None:
                is_hot = cold is None or cold.values().numel() == 0
            if is_hot and self.cold is not None:
                keys = self._part_key_names[COLD]
                cold = KeyedJaggedTensor(
                    keys=keys,
                    values=ordered.values()[:0],
                    lengths=ordered.lengths().new_zeros(len(keys) * ordered.stride()),
                    weights=ordered.weights()[:0] if self._is_weighted else None,
                    stride=ordered.stride(),
                )
            return SplitFeatures(parts.get(HOT), cold, is_hot)

    def forward(self, features: KeyedJaggedTensor | SplitFeatures, hot_only: bool = False) -> KeyedTensor:
        """Pooled embeddings of ``features``, as the unsplit EBC gives them.

        ``features`` is the original ``KeyedJaggedTensor``, remapped here, or its ``split``, made
        before the step. A split batch that ``is_hot`` skips the cold part (a model that calls this
        module itself, as TorchRec's ``DLRM`` does, passes the split on: hot or cold travels with the
        batch); so does an original one with ``hot_only``, which must carry hot ids only: a cold id
        raises ``ValueError`` before any lookup. That check is local to the rank: under DMP
        the other ranks would then wait in the hot part's collectives, so the router must only mark
        batches it made of hot inputs. Under FX tracing (TorchRec's train pipelines) ``features``
        is a split, and both parts are traced.
        """
        if is_fx_symbolic_tracing():
            return self._pool(features.hot, features.cold)
        if len(self._checked) < 2:
            self._check_plan_and_pipeline()
        if isinstance(features, SplitFeatures):
            with record_function(trace.HOT_FORWARD if features.is_hot else trace.COLD_FORWARD):
                return self._pool(features.hot, None if features.is_hot else features.cold)
        with record_function(trace.HOT_FORWARD if hot_only else trace.COLD_FORWARD):
            parts = self._split(self._ordered(features), (HOT,) if hot_only else (HOT, COLD))
            return self._pool(parts.get(HOT), parts.get(COLD))

    def _check_plan_and_pipeline(self) -> None:
        """Warn when the sharded hot part keeps a table out of device memory (checked once the hot part
        is sharded), or when TorchRec's own train pipeline drives the cold part (checked once it is
        pipelined): see the module docstring."""
        plan = getattr(self.hot, "module_sharding_plan", None)  # a sharded part's (DMP's)
        if "plan" not in self._checked and (plan is not None or self.hot is None):
            self._checked.add("plan")
            off_device = {
                table: sharding.compute_kernel
                for table, sharding in (plan or {}).items()
                if sharding.compute_kernel not in HOT_KERNELS
            }
            if off_device:
                kernels = ", ".join(f"{table}: {kernel}" for table, kernel in off_device.items())
                warnings.warn(
                    f"hot tables planned out of device memory ({kernels}): FAE keeps hot rows in HBM, so "
                    "that hot steps read no UVM; plan the model with "
                    "planner.FAEShardingPlanner (TorchRec's own planner does not know which rows are hot)",
                    stacklevel=3,
                )
        if "pipeline" not in self._checked and (self.cold is None or is_pipelined(self.cold)):
            self._checked.add("pipeline")
            if self.cold is None or self.cold_input_skipped_on_hot:
                return
            warnings.warn(
                "the cold part is pipelined by a train pipeline that starts its input distribution on every "
                "batch, hot ones too (TorchRec's TrainPipelineSparseDist): hot steps then pay for the cold "
                "part's collectives; train with fae_torchrec.FAETrainPipeline (or FAEPrefetchTrainPipeline)",
                stacklevel=3,
            )

    def _pool(self, hot: KeyedJaggedTensor | None, cold: KeyedJaggedTensor | None) -> KeyedTensor:
        """The parts' lookups of their inputs (a part with no input is not called), summed per
        feature; MEAN tables divided by the bags' sizes over both parts.

        The result keeps the key order of the first part looked up (a sharded EBC's order is its
        own too), so a hot step returns the hot part's output as it is and a cold step adds the
        cold part's output to it (``_add``): no per-feature work."""
        tracing = is_fx_symbolic_tracing()
        # every lookup first: a sharded part returns at once, its output all-to-all in flight, so
        # one part's all-to-all overlaps the next part's lookup (reading an output waits for it)
        looked_up = [
            (part, getattr(self, part)(kjt), kjt)
            for part, kjt in ((HOT, hot), (COLD, cold))
            if getattr(self, part) is not None and kjt is not None
        ]
        outputs = []
        for part, pooled, kjt in looked_up:
            # under tracing (an analysis of the model by TorchRec's pipeline) keys are not known
            keys = tuple(self._part_key_names[part] if tracing else pooled.keys())
            outputs.append((keys, pooled.values(), part, kjt))
        (keys, values, _, _), *rest = outputs
        missing = tuple(f for f in self._layout.features if f not in keys)
        if missing:  # features whose table has no row in the parts looked up: zeros
            zeros = values.new_zeros(values.shape[0], sum(self._dims[f] for f in missing))
            keys, values = keys + missing, torch.cat([values, zeros], dim=1)
        for other_keys, other, _, _ in rest:
            values = self._add(values, keys, other, other_keys)
        if self._mean_features:
            inputs = [(self._part_key_names[part], kjt) for _, _, part, kjt in outputs]
            values = values / self._bag_sizes(keys, inputs, values)
        return KeyedTensor(keys=list(keys), values=values, length_per_key=[self._dims[f] for f in keys])

    def _add(
        self, values: torch.Tensor, keys: tuple[str, ...], other: torch.Tensor, other_keys: tuple[str, ...]
    ) -> torch.Tensor:
        """``values`` (pooled, ``keys`` order, every feature) plus ``other`` (``other_keys`` order)
        feature by feature: ``other``'s columns are added in runs, one per stretch of features
        consecutive in both orders (a cold part's features mostly make one stretch of the hot part's
        output)."""
        start = dict(zip(keys, np.cumsum([0] + [self._dims[f] for f in keys]).tolist(), strict=False))
        runs: list[list[int]] = []  # [column in values, column in other, width]
        source = 0
        for feature in other_keys:
            column, dim = start[feature], self._dims[feature]
            if runs and runs[-1][0] + runs[-1][2] == column:
                runs[-1][2] += dim
            else:
                runs.append([column, source, dim])
            source += dim
        return _add_columns(values, other, tuple(tuple(run) for run in runs))

    def _bag_sizes(
        self,
        keys: tuple[str, ...],
        inputs: Sequence[tuple[Sequence[str], KeyedJaggedTensor]],
        values: torch.Tensor,
    ) -> torch.Tensor:
        """Per column of ``values`` (``keys`` order): the bag sizes over the parts' ``inputs`` (their
        features and ``KeyedJaggedTensor``s) of a MEAN table's feature (at least 1), 1 for a SUM
        table's."""
        stride = values.shape[0]
        sizes = {f: values.new_zeros(stride) for f in self._mean_features}
        for part_keys, kjt in inputs:
            lengths = kjt.lengths().view(-1, stride)
            for row, feature in enumerate(part_keys):
                if feature in sizes:
                    sizes[feature] = sizes[feature] + lengths[row].to(values.dtype)
        return torch.cat(
            [
                (sizes[f].clamp(min=1) if f in sizes else values.new_ones(stride))
                .unsqueeze(1)
                .expand(-1, self._dims[f])
                for f in keys
            ],
            dim=1,
        )

    def _ordered(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` restricted to this module's features, in table order."""
        keys = features.keys()
        if keys == self._layout.features:
            return features
        missing = [f for f in self._layout.features if f not in keys]
        if missing:
            raise ValueError(f"features {missing} are missing from the batch (keys {keys})")
        return features.permute([keys.index(f) for f in self._layout.features])

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted


def _hot_lengths(
    is_hot: torch.Tensor, lengths: torch.Tensor, hot_through: torch.Tensor | None = None
) -> torch.Tensor:
    """Each bag's hot ids, from the mask ``is_hot`` over the ids of bags of ``lengths``: the mask itself
    where every bag holds one id, else the differences of the running count of hot ids
    (``hot_through``, where the caller has it) at the bags' ends."""
    if len(lengths) == len(is_hot) and (len(lengths) == 0 or bool(lengths.min() >= 1)):
        return is_hot.to(lengths.dtype)
    if hot_through is None:
        hot_through = torch.cumsum(is_hot, 0, dtype=torch.int32)
    kept = torch.cat([hot_through.new_zeros(1), hot_through]).to(lengths.dtype)
    ends = torch.cumsum(lengths, 0)
    return kept[ends] - kept[ends - lengths]


def _checked_cold_tables(cold_tables: Collection[str] | None, num_cold: Mapping[str, int]) -> set[str]:
    """The tables of the cold part: ``cold_tables``, once it holds every table with cold rows (``num_cold``)
    and no other name (``ValueError`` naming one otherwise); by default the tables with cold rows."""
    with_cold = {table for table, rows in num_cold.items() if rows}
    if cold_tables is None:
        return with_cold
    unknown, missing = sorted(set(cold_tables) - set(num_cold)), sorted(with_cold - set(cold_tables))
    if unknown or missing:
        raise ValueError(
            f"cold_tables: {f'no tables {unknown}' if unknown else f'tables {missing} have cold rows'} "
            f"(the cold part must keep every table with cold rows: {sorted(with_cold)})"
        )
    return set(cold_tables)


def _checked_slots(cold_slots: Mapping[str, int], num_cold: Mapping[str, int]) -> dict[str, int]:
    """``cold_slots`` as a dict, once every table with cold rows (``num_cold``) has at least one slot
    and no other table any (``ValueError`` naming the table otherwise)."""
    slots = dict(cold_slots)
    unknown = sorted(set(slots) - set(num_cold))
    if unknown:
        raise ValueError(
            f"cold_slots names tables {unknown} that the module does not have ({list(num_cold)})"
        )
    for table, rows in num_cold.items():
        count = slots.get(table, 0)
        if rows > 0 and count < 1:
            raise ValueError(f"cold_slots: table {table} has {rows} cold rows and needs at least one slot")
        if rows == 0 and count:
            raise ValueError(f"cold_slots: table {table} has no cold row, so no slot ({count} given)")
    return {table: count for table, count in slots.items() if count}


class _AddColumns(torch.autograd.Function):
    """``values`` with ``other``'s columns added in runs (column in ``values``, column in ``other``,
    width; together ``other``'s columns in order): a few wide slice adds where ``index_add`` over
    features makes one narrow strided add per feature. The adds go into ``values`` in place: it is
    the first part's fresh output, which nothing else reads and no backward needs, and a copy of it
    would cost more than the adds (a batch x all features' dims). The backward hands ``values`` its
    gradient as it is and ``other`` the runs' columns of it."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, other: torch.Tensor, runs: tuple) -> torch.Tensor:
        ctx.runs = runs
        for column, source, width in runs:
            values[:, column : column + width] += other[:, source : source + width]
        ctx.mark_dirty(values)
        return values

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        pieces = [grad[:, column : column + width] for column, _, width in ctx.runs]
        return grad, pieces[0].contiguous() if len(pieces) == 1 else torch.cat(pieces, dim=1), None


@torch.fx.wrap
def _add_columns(values: torch.Tensor, other: torch.Tensor, runs: tuple) -> torch.Tensor:
    """``_AddColumns``, kept whole in TorchRec's FX trace of the model (a trace cannot enter it)."""
    return _AddColumns.apply(values, other, runs)


def _check_tables(
    tables: Sequence[EmbeddingBagConfig], layout: TableLayout, hot_set: HotSet, is_weighted: bool
) -> None:
    """``ValueError`` where ``hot_set`` is of other tables, or a table pools as the split cannot."""
    if layout.describe() != hot_set.layout.describe():
        raise ValueError(f"hot set is for other tables: {hot_set.layout.names} vs model {layout.names}")
    for config in tables:
        if config.pooling not in (PoolingType.SUM, PoolingType.MEAN):
            raise ValueError(f"table {config.name}: pooling {config.pooling} is not supported")
        if is_weighted and config.pooling != PoolingType.SUM:
            raise ValueError(f"table {config.name}: weighted features need SUM pooling")
