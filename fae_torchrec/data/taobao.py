"""TBSM's Taobao layout (facebookresearch/tbsm): user behaviour events turned into windows of past events
plus a target event, half of the targets replaced by a random item.

A sample is ``ts_length + 1`` steps (20 past events and the target in the reference). Each step has three
single-hot ids, one per table (user, item, category; the user is the same at every step), and one dense
feature, the step's position ``t / (ts_length + 1)``. Features are table-major, ``user_00 .. user_20,
item_00 .. item_20, category_00 .. category_20``; the 21 features of a kind share one table (an
``EmbeddingBagConfig`` with 21 feature names pools each step on its own, and the planner shards one table
per kind). Row 0 of each table pads a history shorter than the window; real ids are rows 1..n.

Train and validation are split by user as in TBSM's ``taobao_prepare.py``: the users whose last event is
later than the ``1 - test_share`` quantile of all users' last event times are validation users.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

# TS_LENGTH (past events a sample), POINTS_PER_USER (training windows a user at most, TBSM's
# --points-per-user), TEST_SHARE (users held out for validation, the last active): the options' defaults
from fae_torchrec.command_line import POINTS_PER_USER, TEST_SHARE, TS_LENGTH
from fae_torchrec.data.block import SampleBlock, rebatch
from fae_torchrec.data.source import BlockSource

#: The tables, in feature order; table ``t_user`` reads features ``user_00`` .. ``user_20``.
TABLES = ("user", "item", "category")
#: Users, items and categories of the reference run (TBSM's ``--arch-embedding-size``).
REFERENCE_TABLE_SIZES = (987_994, 4_162_024, 9_439)
#: Behaviour codes of :class:`Events` (``UserBehavior.csv``'s ``behavior_type``), in code order.
BEHAVIORS = ("pv", "buy", "cart", "fav")
#: Samples per block of :meth:`TaobaoSource.raw_blocks`.
RAW_BLOCK_SIZE = 1 << 16


def tbsm_feature_names(ts_length: int = TS_LENGTH) -> list[str]:
    """Feature names, table-major: ``user_00 .. user_{ts_length}``, then item, then category steps
    (as many digits as ``ts_length`` has, at least 2)."""
    _check_positive("ts_length", ts_length)
    width = max(2, len(str(ts_length)))
    return [f"{table}_{step:0{width}d}" for table in TABLES for step in range(ts_length + 1)]


def tbsm_table_configs(
    table_sizes: Sequence[int], embedding_dim: int = 16, ts_length: int = TS_LENGTH
) -> list[EmbeddingBagConfig]:
    """Tables ``t_user``, ``t_item``, ``t_category``, each read by its ``ts_length + 1`` step features.

    ``table_sizes`` are rows per table including padding row 0 (an ``Events``' ``table_sizes``).
    """
    sizes = checked_table_sizes(table_sizes)
    names = tbsm_feature_names(ts_length)
    steps = ts_length + 1
    return [
        EmbeddingBagConfig(
            name=f"t_{table}",
            embedding_dim=embedding_dim,
            num_embeddings=size,
            feature_names=names[t * steps : (t + 1) * steps],
        )
        for t, (table, size) in enumerate(zip(TABLES, sizes, strict=True))
    ]


@dataclass(frozen=True)
class Events:
    """User behaviour events as columns: ids are table rows 1..n (0 is padding), ``behavior`` a code of
    ``BEHAVIORS``, ``timestamp`` unix seconds; ``table_sizes`` are rows per table including row 0."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    behavior: np.ndarray
    timestamp: np.ndarray
    table_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        sizes = checked_table_sizes(self.table_sizes)
        columns = (self.user, self.item, self.category, self.behavior, self.timestamp)
        if len({len(c) for c in columns}) != 1:
            raise ValueError(f"event columns differ in length: {[len(c) for c in columns]}")
        for table, ids, size in zip(TABLES, columns[: len(TABLES)], sizes, strict=True):
            if len(ids) and not 1 <= ids.min() <= ids.max() < size:
                raise ValueError(f"{table} ids must be rows 1..{size - 1}, found {ids.min()}..{ids.max()}")

    def __len__(self) -> int:
        return len(self.user)


def tbsm_samples(
    events: Events,
    ts_length: int = TS_LENGTH,
    points_per_user: int = POINTS_PER_USER,
    test_share: float = TEST_SHARE,
    seed: int = 0,
) -> tuple[SampleBlock, SampleBlock]:
    """TBSM's training and validation samples of ``events``.

    Each user's events are ordered by time (ties keep the input order). Training users give up to
    ``points_per_user`` windows whose targets are distinct positions drawn among 1..L-1 of their L
    events (a target needs a past event); validation users give one window ending at their last event.
    A window's steps before the user's first event hold row 0 for item and category (the user row
    stays). Each target is then replaced with chance 1/2 by a random other item (label 0; its category
    is the one of the item's earliest event), else kept (label 1). The replacement is drawn among the
    items that occur in ``events``, which for read data are all rows 1..n, as in TBSM (a synthetic
    table's unused rows have no category). Training samples come in a random order, validation samples
    in user order; all draws come from ``seed``.
    """
    _check_positive("ts_length", ts_length)
    _check_positive("points_per_user", points_per_user)
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must be in (0, 1), got {test_share}")
    if not len(events):
        raise ValueError("no events")
    rng = np.random.default_rng(seed)
    order = np.lexsort((events.timestamp, events.user))
    user, item, category = events.user[order], events.item[order], events.category[order]
    first = _run_starts(user)
    ends = np.append(first[1:], len(user))
    last_time = events.timestamp[order][ends - 1]
    split_time = np.sort(last_time)[int(len(first) * (1.0 - test_share))]
    test = last_time > split_time
    group = np.repeat(np.arange(len(first)), ends - first)

    candidates = np.flatnonzero((np.arange(len(user)) > first[group]) & ~test[group])
    candidates = candidates[np.lexsort((rng.random(len(candidates)), group[candidates]))]
    rank = np.arange(len(candidates)) - np.searchsorted(group[candidates], group[candidates])
    train_targets = rng.permutation(candidates[rank < points_per_user])
    targets = np.concatenate([train_targets, ends[test] - 1])

    steps = np.arange(-ts_length, 1)
    positions = targets[:, None] + steps
    padding = positions < first[group[targets]][:, None]
    positions[padding] = 0
    items = np.where(padding, 0, item[positions])
    categories = np.where(padding, 0, category[positions])
    users = np.repeat(user[targets][:, None], len(steps), axis=1)

    replaced = _replace_targets(events, items, categories, rng)
    block = SampleBlock(
        dense=np.tile((np.arange(len(steps)) / len(steps)).astype(np.float32), (len(targets), 1)),
        ids=np.concatenate([users, items, categories], axis=1),
        labels=(~replaced).astype(np.int32),
        ids_per_feature=(1,) * (len(TABLES) * len(steps)),
    )
    return block.slice(0, len(train_targets)), block.slice(len(train_targets), len(targets))


def _replace_targets(
    events: Events, items: np.ndarray, categories: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Replace each window's target (its last step of ``items`` and ``categories``, in place) with chance
    1/2 by another item of ``events`` drawn at random, with its category; which were replaced (label 0)."""
    known_items, known_categories = _item_categories(events)
    replaced = rng.random(len(items)) < 0.5
    real = items[replaced, -1]
    drawn = rng.integers(0, len(known_items) - 1, size=len(real))
    drawn += drawn >= np.searchsorted(known_items, real)
    items[replaced, -1] = known_items[drawn]
    categories[replaced, -1] = known_categories[drawn]
    return replaced


class TaobaoSource(BlockSource):
    """TBSM samples of ``events`` (:func:`tbsm_samples`, built once, here) as a data source: ``train``
    and ``validation`` blocks, ``Batch``es with one key per step feature (``tbsm_feature_names``).

    The events are not kept: only the samples and the table sizes.
    """

    def __init__(
        self,
        events: Events,
        batch_size: int,
        ts_length: int = TS_LENGTH,
        points_per_user: int = POINTS_PER_USER,
        test_share: float = TEST_SHARE,
        seed: int = 0,
    ) -> None:
        super().__init__(batch_size, tbsm_feature_names(ts_length))
        self.ts_length = ts_length
        self.table_sizes = events.table_sizes
        self.train, self.validation = tbsm_samples(events, ts_length, points_per_user, test_share, seed)
        self.num_dense = self.ts_length + 1  # one dense feature a step: its position in the history
        self.num_samples: int = len(self.train) + len(self.validation)

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def num_validation(self) -> int:
        return len(self.validation)

    def table_configs(self, embedding_dim: int = 16) -> list[EmbeddingBagConfig]:
        return tbsm_table_configs(self.table_sizes, embedding_dim, self.ts_length)

    def raw_blocks(self) -> Iterator[SampleBlock]:
        """All samples, training then validation, in blocks of at most ``RAW_BLOCK_SIZE``."""
        return rebatch([self.train, self.validation], RAW_BLOCK_SIZE)

    def split_masks(
        self, every: int | None, block_size: int, start: int, stop: int | None
    ) -> Iterator[tuple[SampleBlock, np.ndarray]]:
        """The samples among raw samples ``start`` to ``stop`` (None: the end; training first, as
        ``raw_blocks`` gives them) in blocks of at most ``block_size``, those of validation marked.
        ``every`` is ignored: TBSM splits by time (the users active last are held out), not every n-th
        input."""
        for first, part, held in ((0, self.train, False), (len(self.train), self.validation, True)):
            last = len(part) if stop is None else min(stop - first, len(part))
            for block in rebatch([part.slice(max(start - first, 0), max(last, 0))], block_size):
                yield block, np.full(len(block), held)

    def training_before(self, position: int, every: int | None) -> int:
        """Training samples before raw sample ``position`` (``every`` ignored)."""
        return min(position, len(self.train))


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def checked_table_sizes(table_sizes: Sequence[int]) -> tuple[int, ...]:
    """``table_sizes`` as ints, checked to be one positive size per table of ``TABLES``."""
    sizes = tuple(int(s) for s in table_sizes)
    if len(sizes) != len(TABLES) or min(sizes) <= 0:
        raise ValueError(f"expected {len(TABLES)} positive table sizes ({', '.join(TABLES)}), got {sizes}")
    return sizes


def _run_starts(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a non-empty array starts."""
    return np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))


def _item_categories(events: Events) -> tuple[np.ndarray, np.ndarray]:
    """The distinct items of ``events``, ascending, and the category of each item's earliest event."""
    order = np.lexsort((events.timestamp, events.item))
    first = _run_starts(events.item[order])
    items = events.item[order][first]
    if len(items) < 2:
        raise ValueError("negative samples need at least two distinct items")
    return items, events.category[order][first]
