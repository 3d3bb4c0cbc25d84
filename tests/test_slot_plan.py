"""The slot plan of the planned cold tier: Belady's counts, residency, remaps, windows and errors."""

from itertools import combinations

import numpy as np
import pytest

from benchmarks.common.cache_model import BatchedKeys, belady_moves
from fae_torchrec.train.slot_plan import SlotPlan, allocate_slots, copied_before, min_slots, plan_slots


def _skewed_steps(seed: int, steps: int = 60, per_step: int = 12, rows: int = 200) -> tuple:
    """Ids of ``steps`` steps drawn from a Zipf-like popularity over ``rows`` rows, repeats included."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, rows + 1) ** 1.1
    sizes = rng.integers(1, per_step + 1, steps)
    ids = rng.permutation(rows)[rng.choice(rows, int(sizes.sum()), p=popularity / popularity.sum())]
    return ids, np.r_[0, np.cumsum(sizes)]


def _replay(plan: SlotPlan) -> None:
    """Apply the plan's evictions and loads step by step, each step's before the step ``ahead`` steps
    earlier, and check every step finds its rows where the plan's remap says, one row per slot, and
    that evicted rows were last used before the copies run."""
    held = np.full(plan.num_slots, -1)
    for s in range(plan.num_steps):
        for u in copied_before(s, plan.ahead, plan.num_steps):
            rows, slots = plan.evictions(u)
            assert np.array_equal(held[slots], rows), f"step {u} evicts rows its slots hold"
            span = slice(plan.evicted_bounds[u], plan.evicted_bounds[u + 1])
            assert np.all(plan.evicted_after[span] < s), f"step {u}'s evictions were used before step {s}"
            held[slots] = -1
            rows, slots = plan.loads(u)
            assert np.all(held[slots] == -1), f"step {u} loads into slots that are free"
            held[slots] = rows
        mine = plan.rows[plan.bounds[s] : plan.bounds[s + 1]]
        remapped = plan.remap(s, mine)
        assert len(np.unique(remapped)) == len(mine), "distinct rows get distinct slots"
        assert np.array_equal(held[remapped], mine), f"step {s}: its rows are resident at their slots"
        assert np.array_equal(np.unique(held[held >= 0]), np.sort(held[held >= 0])), "a row in one slot"
    assert np.array_equal(np.sort(held[held >= 0]), np.sort(plan.resident_rows))
    assert np.array_equal(held[plan.resident_slots], plan.resident_rows)


def _fewest_loads(ids: np.ndarray, bounds: np.ndarray, num_slots: int) -> int:
    """The fewest rows any plan of ``num_slots`` slots loads (each step's rows all in slots), by
    trying every choice of rows kept after each step."""
    states = {frozenset(): 0}
    for s in range(len(bounds) - 1):
        needed = frozenset(ids[bounds[s] : bounds[s + 1]].tolist())
        after: dict[frozenset, int] = {}
        for held, loads in states.items():
            others = sorted(held - needed)
            for keep in range(min(len(others), num_slots - len(needed)) + 1):
                for kept in combinations(others, keep):
                    state = needed | frozenset(kept)
                    after[state] = min(after.get(state, loads + 99), loads + len(needed - held))
        states = after
    return min(states.values())


@pytest.mark.parametrize("seed", range(12))
def test_whole_epoch_plan_loads_the_fewest_rows_any_plan_can(seed):
    ids, bounds = _skewed_steps(seed, steps=14, per_step=3, rows=14)
    for num_slots in (3, 4, 5):
        plan = plan_slots(ids, bounds, num_slots)
        _replay(plan)
        assert plan.rows_in == _fewest_loads(ids, bounds, num_slots), (seed, num_slots)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_slots", [12, 20, 50, 400])
def test_whole_epoch_plan_lies_between_beladys_caches_of_its_slots_and_of_its_slots_less_a_step(
    seed, num_slots
):
    """``belady_moves``' cache keeps ``capacity`` rows between steps but may hold a step's misses on
    top (it evicts after the step, the rows just used included): a bound below the slots' loads.
    With ``S - largest step`` rows it never holds more than ``S``: a plan of ``S`` slots, so the
    optimal plan loads no more. Both caches start preloaded; the slots start empty."""
    ids, bounds = _skewed_steps(seed)
    plan = plan_slots(ids, bounds, num_slots)
    _replay(plan)
    steps = BatchedKeys.of(np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)), ids)
    distinct, largest = len(np.unique(ids)), int(np.diff(steps.bounds).max())

    def loads(capacity: int) -> int:
        return int(belady_moves(steps, capacity)[0].sum()) + min(capacity, distinct)

    assert loads(num_slots) <= plan.rows_in <= loads(max(num_slots - largest, 0))
    assert plan.rows_out == plan.rows_in - len(plan.resident_rows), "every row loaded leaves or stays"
    assert len(plan.resident_rows) == min(num_slots, distinct)
    assert plan.loads_per_step().sum() == plan.rows_in and plan.evictions_per_step().sum() == plan.rows_out
    if num_slots >= distinct:
        assert plan.rows_in == distinct and plan.rows_out == 0


def test_evicted_rows_were_last_used_before_their_step_and_come_back_only_when_needed():
    ids, bounds = _skewed_steps(7)
    plan = plan_slots(ids, bounds, 16)
    step_of = np.repeat(np.arange(plan.num_steps), np.diff(plan.evicted_bounds))
    assert np.all(plan.evicted_after < step_of) and np.all(plan.evicted_after >= 0)
    for s in range(plan.num_steps):  # a row loaded at s is looked up at s
        rows, _ = plan.loads(s)
        assert np.isin(rows, ids[bounds[s] : bounds[s + 1]]).all()


def test_a_window_longer_than_the_epoch_is_the_whole_epoch_and_shorter_ones_never_beat_it():
    ids, bounds = _skewed_steps(3, steps=80)
    whole = plan_slots(ids, bounds, 20)
    long = plan_slots(ids, bounds, 20, window=80)
    for name in ("rows", "slots", "loaded", "evicted_rows", "evicted_slots", "evicted_bounds"):
        assert np.array_equal(getattr(whole, name), getattr(long, name)), name
    moved = []
    for window in (1, 2, 4, 16):
        plan = plan_slots(ids, bounds, 20, window=window)
        _replay(plan)
        assert plan.rows_in >= whole.rows_in and plan.window == window
        moved.append(plan.rows_in)
    assert moved[0] > whole.rows_in, "one step of look-ahead is not Belady's plan on this stream"


def test_remap_takes_repeats_and_refuses_rows_the_step_does_not_look_up():
    plan = plan_slots(np.array([5, 9, 5, 2, 9]), np.array([0, 3, 5]), 2)
    five, nine = plan.remap(0, np.array([5, 9]))
    assert five != nine and plan.remap(0, np.array([9, 5, 9])).tolist() == [nine, five, nine]
    assert plan.rows_in == 3 and plan.rows_out == 1
    assert plan.evictions(1)[0].tolist() == [5], "5 is never used again, 9 is"
    assert plan.loads(1)[1].tolist() == [five], "2 takes 5's slot"
    with pytest.raises(ValueError, match=r"step 1 does not look up rows \[5\]"):
        plan.remap(1, np.array([2, 5]))


def test_bad_inputs_are_refused_by_name():
    ids, bounds = np.array([1, 2, 3, 3, 4]), np.array([0, 2, 5])
    with pytest.raises(ValueError, match="step 1 looks up 2 distinct rows, more than the 1 slots"):
        plan_slots(np.array([1, 1, 3, 4]), np.array([0, 2, 4]), 1)
    with pytest.raises(ValueError, match="num_slots must be at least 1"):
        plan_slots(ids, bounds, 0)
    with pytest.raises(ValueError, match="window must be at least 1"):
        plan_slots(ids, bounds, 4, window=0)
    with pytest.raises(ValueError, match="bounds must rise from 0 to len"):
        plan_slots(ids, np.array([0, 2, 4]), 4)
    with pytest.raises(ValueError, match="non-negative"):
        plan_slots(np.array([1, -2]), np.array([0, 2]), 4)
    with pytest.raises(ValueError, match=r"overflow the \(step, row\) keys: renumber the rows"):
        plan_slots(np.array([1 << 61]), np.array([0, 0, 1]), 4)


def test_an_empty_epoch_plans_nothing():
    plan = plan_slots(np.zeros(0, dtype=np.int64), np.array([0, 0, 0]), 3)
    assert plan.num_steps == 2 and plan.rows_in == plan.rows_out == 0 and len(plan.resident_rows) == 0


def _copies(pool: tuple, slots: int) -> int:
    plan = plan_slots(*pool, slots)
    return plan.rows_in + plan.rows_out


def test_slots_go_where_the_copies_fall_most_per_byte():
    """A pool whose rows come back (a skewed stream) gets the budget; one whose every row is new (no
    plan copies fewer with more slots) keeps its floor; the sizes fit the budget and copy no more than
    the same budget split evenly."""
    skewed = _skewed_steps(3, steps=80)
    fresh = (np.arange(80 * 12), np.arange(0, 80 * 12 + 1, 12))
    pools, floor = {"skewed": skewed, "fresh": fresh}, {"skewed": 12, "fresh": 12}
    row_bytes = {"skewed": 8.0, "fresh": 16.0}
    budget = 8.0 * 12 + 16.0 * 12 + 8.0 * 60
    allocation = allocate_slots(pools, row_bytes, budget, floor)
    sizes = allocation.slots
    assert allocation.copied_rows == {p: _copies(pools[p], sizes[p]) for p in pools}
    assert sizes["fresh"] == 12 and 12 < sizes["skewed"] <= len(np.unique(skewed[0]))
    assert sum(sizes[p] * row_bytes[p] for p in pools) <= budget
    even = {"skewed": 12 + 30, "fresh": 12 + 15}  # the same bytes split evenly
    assert sum(_copies(pools[p], sizes[p]) for p in pools) < sum(_copies(pools[p], even[p]) for p in pools)
    assert allocate_slots(pools, row_bytes, budget, floor, window=4).slots["fresh"] == 12
    over = allocate_slots(pools, row_bytes, 100.0, floor)
    assert over.slots == floor, "floors over the budget: as they are"
    assert over.copied_rows == {p: _copies(pools[p], floor[p]) for p in pools}
    roomy = allocate_slots(pools, row_bytes, 1e9, floor).slots
    assert roomy["skewed"] == len(np.unique(skewed[0])), "no more slots than distinct rows"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ahead", [1, 3])
def test_copies_ahead_keep_the_rows_of_the_steps_before_and_cost_no_fewer_copies(seed, ahead):
    """Copies ``ahead`` steps early never take a slot a step in between looks up (the replay checks
    every step's rows at their slots), and move at least the rows the plan copying just before each
    step moves: that plan is optimal."""
    ids, bounds = _skewed_steps(seed)
    for num_slots in (40, 80, 400):
        plan = plan_slots(ids, bounds, num_slots, ahead=ahead)
        assert plan.ahead == ahead
        _replay(plan)
        assert plan.rows_in >= plan_slots(ids, bounds, num_slots).rows_in
        windowed = plan_slots(ids, bounds, num_slots, window=5, ahead=ahead)
        _replay(windowed)


def test_copies_ahead_need_the_rows_of_that_many_steps_more_in_slots():
    ids, bounds = np.array([1, 2, 3, 4, 1, 2]), np.array([0, 2, 4, 6])
    assert plan_slots(ids, bounds, 2).rows_in == 6
    with pytest.raises(ValueError, match="steps 0 to 1 look up more distinct rows than the 2 slots"):
        plan_slots(ids, bounds, 2, ahead=1)
    plan = plan_slots(ids, bounds, 4, ahead=1)
    _replay(plan)
    assert plan.rows_in == 4, "rows 1 and 2 stay while rows 3 and 4 are copied in"
    assert list(copied_before(0, plan.ahead, plan.num_steps)) == [0, 1]
    assert list(copied_before(1, plan.ahead, plan.num_steps)) == [2]
    assert list(copied_before(2, plan.ahead, plan.num_steps)) == []
    with pytest.raises(ValueError, match="ahead must be at least 0"):
        plan_slots(ids, bounds, 4, ahead=-1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ahead", [0, 1, 4])
def test_min_slots_is_the_fewest_the_plan_takes(seed, ahead):
    ids, bounds = _skewed_steps(seed)
    fewest = min_slots(ids, bounds, ahead)
    runs = [len(np.unique(ids[bounds[max(s - ahead, 0)] : bounds[s + 1]])) for s in range(len(bounds) - 1)]
    assert fewest == max(runs)
    _replay(plan_slots(ids, bounds, fewest, ahead=ahead))
    with pytest.raises(ValueError, match=r"distinct rows, more than|more distinct rows than"):
        plan_slots(ids, bounds, fewest - 1, ahead=ahead)
    assert min_slots(np.zeros(0, dtype=np.int64), np.array([0, 0]), ahead) == 1
