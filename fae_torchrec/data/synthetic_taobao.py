"""Synthetic Taobao-like user behaviour: skewed items, categories that follow items, users with tastes.

Items draw ranks from the same truncated power law as :class:`SyntheticCriteo`'s rows, spread over the
table by a random affine permutation. A fixed map gives each item a category (a power-law draw, so that
a few categories hold many items). Each user has ``PREFERRED_CATEGORIES`` preferred categories (those of
a few popular items) and takes a share ``FOCUS`` of its events from them (by item popularity within the
category), the rest from all items: a real next item usually shares a category with the history, a
random replacement seldom does, which gives TBSM's model something to learn. A user's event count is
geometric with mean ``events_per_user``; its events start at a uniform time in ``SPAN_SECONDS`` and are
``MEAN_GAP_SECONDS`` apart on average, so users' last event times spread and the split by time holds
users of every kind. Everything is drawn, whole arrays at a time, from the seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fae_torchrec.data.criteo import scaled_table_sizes
from fae_torchrec.data.synthetic import DEFAULT_EXPONENT, coprime, power_law_ranks
from fae_torchrec.data.taobao import (
    BEHAVIORS,
    POINTS_PER_USER,
    REFERENCE_TABLE_SIZES,
    TEST_SHARE,
    TS_LENGTH,
    Events,
    TaobaoSource,
    checked_table_sizes,
)

#: Categories each user prefers.
PREFERRED_CATEGORIES = 3
#: Share of a user's events drawn from its preferred categories.
FOCUS = 0.8
#: Mean events per user (the 2-hour slice of the real log has 1.7, the reference's 9 days about 100).
EVENTS_PER_USER = 30.0
#: First event time (Taobao's log starts on 2017-11-25) and the span over which users start.
START_TIME = 1_511_568_000
SPAN_SECONDS = 9 * 24 * 3600
MEAN_GAP_SECONDS = 3600.0
#: Share of each behaviour among events (the real 2-hour slice's: pv, buy, cart, fav).
BEHAVIOR_SHARES = (0.892, 0.023, 0.055, 0.030)


def taobao_like_events(
    num_users: int,
    table_sizes: Sequence[int] = REFERENCE_TABLE_SIZES,
    events_per_user: float = EVENTS_PER_USER,
    seed: int = 0,
) -> Events:
    """Events of ``num_users`` users over tables of ``table_sizes`` real ids (users, items, categories;
    each table has one more row, padding row 0). The users take distinct rows; when they outnumber
    ``table_sizes[0]`` the user table grows to ``num_users`` real rows."""
    if num_users <= 0:
        raise ValueError(f"num_users must be positive, got {num_users}")
    if not events_per_user >= 1.0:
        raise ValueError(f"events_per_user must be at least 1, got {events_per_user}")
    num_user_rows, num_items, num_categories = checked_table_sizes(table_sizes)
    num_user_rows = max(num_user_rows, num_users)
    rng = np.random.default_rng(seed)
    counts = rng.geometric(1.0 / events_per_user, num_users)
    owner = np.repeat(np.arange(num_users), counts)

    item_of_rank = (np.arange(num_items) * coprime(rng, num_items) + int(rng.integers(num_items))) % num_items
    category_ranks = power_law_ranks(rng.random(num_items), num_categories, DEFAULT_EXPONENT)
    category_of_rank = (
        1
        + (category_ranks * coprime(rng, num_categories) + int(rng.integers(num_categories))) % num_categories
    )
    by_category = np.argsort(category_of_rank, kind="stable")
    category_start = np.searchsorted(category_of_rank[by_category], np.arange(1, num_categories + 2))

    preferred = category_of_rank[
        power_law_ranks(rng.random((num_users, PREFERRED_CATEGORIES)), num_items, DEFAULT_EXPONENT)
    ]
    focused = rng.random(len(owner)) < FOCUS
    chosen = preferred[owner[focused], rng.integers(PREFERRED_CATEGORIES, size=int(focused.sum()))]
    in_category = category_start[chosen] - category_start[chosen - 1]
    ranks = power_law_ranks(rng.random(len(owner)), num_items, DEFAULT_EXPONENT)
    ranks[focused] = by_category[
        category_start[chosen - 1] + power_law_ranks(rng.random(len(chosen)), in_category, DEFAULT_EXPONENT)
    ]

    gaps = rng.exponential(MEAN_GAP_SECONDS, len(owner)).astype(np.int64)
    elapsed = np.cumsum(gaps)
    first = np.cumsum(counts) - counts
    start = START_TIME + rng.integers(SPAN_SECONDS, size=num_users) - (elapsed[first] - gaps[first])
    return Events(
        user=1 + rng.choice(num_user_rows, num_users, replace=False)[owner],
        item=1 + item_of_rank[ranks],
        category=category_of_rank[ranks],
        behavior=rng.choice(len(BEHAVIORS), len(owner), p=BEHAVIOR_SHARES).astype(np.int8),
        timestamp=start[owner] + elapsed,
        table_sizes=(num_user_rows + 1, num_items + 1, num_categories + 1),
    )


class SyntheticTaobao(TaobaoSource):
    """TBSM samples of :func:`taobao_like_events`: a stand-in for Taobao, deterministic by ``seed``.

    Args:
        num_users: users with events (the data's size).
        batch_size: inputs per ``Batch`` (the last one may be smaller).
        table_sizes: real ids per table (users, items, categories) before ``scale``; default the
            reference run's. Each table has one more row, padding row 0.
        scale: table sizes are ``table_sizes`` times ``scale``.
        events_per_user: mean events per user (geometric).
        seed: the events and the samples drawn from them.
        ts_length, points_per_user, test_share: as :func:`tbsm_samples` takes them.
    """

    def __init__(
        self,
        num_users: int,
        batch_size: int = 2048,
        *,
        table_sizes: Sequence[int] = REFERENCE_TABLE_SIZES,
        scale: float = 1.0,
        events_per_user: float = EVENTS_PER_USER,
        seed: int = 0,
        ts_length: int = TS_LENGTH,
        points_per_user: int = POINTS_PER_USER,
        test_share: float = TEST_SHARE,
    ) -> None:
        events = taobao_like_events(num_users, scaled_table_sizes(scale, table_sizes), events_per_user, seed)
        super().__init__(events, batch_size, ts_length, points_per_user, test_share, seed)
        self.num_users = num_users
