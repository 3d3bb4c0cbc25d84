"""Deciding to re-plan (``Replanner``): drift beyond chance, a move only when it pays, none that changes
nothing, none that loses share on the inputs it re-partitions, none on a gain within chance; the
``--replan`` words."""

import numpy as np
import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from fae_torchrec.recipes.options import replan_policy
from fae_torchrec.stats import COLD, HOT, AccessProfiler, Holdout, HotSet, RecentAccessCounts
from fae_torchrec.stats.hot_share import ShareEstimate, compare_hot_sets
from fae_torchrec.train.replan import Replanner, ReplanPolicy
from fae_torchrec.train.schedule import Step

TABLES = [
    EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=4, feature_names=[f"f{i}"])
    for i in range(2)
]
#: 64 rows of the two tables (16 bytes a row).
BUDGET = 64 * 16


def _batches(offset: int, steps: int, seed: int, rows: int = 900):
    """Skewed ids of ``rows`` rows whose most popular rows start at ``offset`` (a drift moves them)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield {f"f{i}": (np.minimum(rng.zipf(1.5, 2000), rows) - 1 + offset) % 1000 for i in range(2)}


def _replanner(
    mode: str, offset_now: int, planned: float = 0.6, rows: int = 900
) -> tuple[Replanner, np.ndarray]:
    """A replanner whose hot set was profiled where popularity started (offset 0), having watched 20
    steps of popularity at ``offset_now``; the share of those steps the old hot set makes hot."""
    stats = AccessProfiler(TABLES, 1.0, holdout_size=0).profile(_batches(0, 20, 1, rows))
    hot_set = stats.hot_set(BUDGET)
    counts = RecentAccessCounts(TABLES, 256, sample_fraction=0.5, holdout_fraction=0.5, half_life=10)
    replanner = Replanner(
        counts, hot_set, ShareEstimate(planned, planned - 0.01, planned + 0.01, 10_000), BUDGET, None,
        ReplanPolicy(mode, every=20, window=20),
    )  # fmt: skip
    shares = []
    for batch in _batches(offset_now, 20, 2, rows):
        counts.update(batch)
        hot = int(hot_set.is_hot_input(batch).sum())
        replanner.observe(Step(False, (((HOT, 0, hot), (COLD, 0, 2000 - hot)),)))
        shares.append(hot / 2000)
    return replanner, np.array(shares)


def test_no_drift_no_check_and_a_recent_hot_set_like_the_old_is_no_move():
    replanner, shares = _replanner("auto", 0, planned=0.5)
    assert replanner.due(20) and not replanner.due(19)
    decision = replanner.decide(10**6, 2000, 0.001, 0.002, 1.0)
    assert abs(decision.measured.share - shares.mean()) < 1e-12
    assert not decision.drifted and decision.hot_set is None and not decision.replan
    # every 20 steps, on 32 rows a table that the budget holds whole: the recent hot set is the old one,
    # row for row, so nothing moves
    replanner, shares = _replanner("every", 0, rows=32)
    assert shares.min() == 1.0
    decision = replanner.decide(10**6, 2000, 0.001, 0.002, 1.0)
    old, new = replanner.hot_set.hot_ids, decision.hot_set.hot_ids
    assert all(np.array_equal(a, b) for a, b in zip(old, new, strict=True))
    assert decision.rows_moved == 0 and not decision.replan


def test_drift_that_pays_is_followed_and_one_that_does_not_is_not():
    replanner, shares = _replanner("auto", 500)
    assert shares.mean() < 0.3, "the old hot set misses the rows popular now"
    decision = replanner.decide(10**7, 2000, 0.001, 0.002, 1.0)
    assert decision.drifted and decision.proposed.share > decision.current.share + 0.3
    assert decision.rows_moved > 0 and decision.bytes_moved == 16 * decision.rows_moved
    # the gain counts the share gained beyond chance: a little under the change
    assert 0.3 < decision.gained < decision.proposed.share - decision.current.share
    expected = 10**7 * decision.gained * 0.001 / 2000
    assert decision.gain_seconds == pytest.approx(expected) and decision.replan
    costly = replanner.decide(10**7, 2000, 0.001, 0.002, 10 * expected)
    assert costly.drifted and not costly.replan, "a move that costs more than it saves"
    replanner.moved_to(decision.hot_set, decision.proposed)
    assert not replanner.due(20), "the window starts again"
    assert "clearly below" in str(costly) and "re-planning" in str(decision)


def _holdout(offset: int, seed: int) -> Holdout:
    """The inputs of a step of popularity at ``offset``, as a holdout (global rows: table 1 after 0)."""
    batch = next(_batches(offset, 1, seed))
    rows = np.stack([batch["f0"], 1000 + batch["f1"]], axis=1)
    return Holdout(rows.ravel(), np.repeat(np.arange(len(rows)), 2), len(rows))


def test_every_moves_only_when_the_inputs_it_repartitions_gain():
    """The recent hot set fits the popularity watched (offset 500) and wins on the recent held-out
    inputs; when the rest of the epoch has the plan's popularity (offset 0) it would lose there, and is
    not taken."""
    replanner, _ = _replanner("every", 500)
    recent = replanner.decide(10**6, 2000, 0.001, 0.002, 1.0)
    assert recent.replan and recent.proposed.share > recent.current.share + 0.3, "judged on the recent past"
    back = replanner.decide(10**6, 2000, 0.001, 0.002, 1.0, _holdout(0, 3))
    assert back.current.num_inputs == 2000 and back.proposed.share < back.current.share - 0.3
    assert back.rows_moved > 0 and back.gained == 0 and not back.replan
    ahead = replanner.decide(10**6, 2000, 0.001, 0.002, 1.0, _holdout(500, 3))
    assert ahead.replan and ahead.gained > 0.3


def test_a_gain_within_chance_is_none():
    """Paired: of 10,000 inputs only those hot under one hot set alone count. 30 gained against 20 lost
    is within chance; 4,900 gained is not."""
    tables = (TABLES[0],)
    rows = np.arange(10_000) % 1000  # one row an input, each row looked up by ten
    holdout = Holdout(rows, np.arange(10_000), 10_000)
    before = HotSet(tables, (np.arange(10),))
    for hot, change, clear in ((np.arange(2, 13), 0.001, False), (np.arange(500), 0.49, True)):
        compared = compare_hot_sets(holdout, before, HotSet(tables, (hot,)))
        assert compared.change == pytest.approx(change)
        assert compared.after.share - compared.before.share == pytest.approx(change)
        assert (compared.low > 0) == clear and compared.low < compared.change
    same = compare_hot_sets(holdout, before, before)
    assert same.change == same.low == 0


def test_never_watches_and_never_decides():
    replanner, _ = _replanner("never", 500)
    assert not any(replanner.due(step) for step in range(1, 100))
    assert replanner.measured().share < 0.3


@pytest.mark.parametrize(
    ("words", "expected"),
    [(["never"], ("never", 7)), (["auto"], ("auto", 7)), (["every", "25"], ("every", 25))],
)
def test_replan_words(words, expected):
    policy = replan_policy(words, 7)
    assert (policy.mode, policy.every, policy.window) == (*expected, 7)


@pytest.mark.parametrize("words", [["sometimes"], ["every"], ["every", "0"], ["every", "x"], ["auto", "3"]])
def test_bad_replan_words_are_refused(words):
    with pytest.raises(ValueError, match="never, auto or every N"):
        replan_policy(words, 7)
    with pytest.raises(ValueError, match="re-plan mode"):
        ReplanPolicy("sometimes")
