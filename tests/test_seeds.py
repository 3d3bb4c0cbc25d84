"""Each purpose draws from its own stream of the seed, never the one that made the data."""

from __future__ import annotations

import numpy as np
import pytest

from fae_torchrec.data.synthetic import SyntheticCriteo
from fae_torchrec.seeds import STREAMS, generator
from fae_torchrec.stats.profiler import AccessProfiler
from fae_torchrec.train.schedule import make_schedule


def _first(rng: np.random.Generator) -> np.ndarray:
    return rng.random(8)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_streams_differ_from_each_other_and_from_plain_seeds(seed):
    assert np.array_equal(
        _first(np.random.default_rng([seed, 0])), _first(np.random.default_rng(seed))
    )  # the trap
    plain = [_first(np.random.default_rng(seed))] + [
        _first(np.random.default_rng([seed, k])) for k in range(1, 4)
    ]
    ours = [_first(generator(seed, purpose, *keys)) for purpose in STREAMS for keys in [(), (0,), (1,)]]
    draws = plain + ours
    assert len({d.tobytes() for d in draws}) == len(draws)
    assert np.array_equal(_first(generator(seed, "schedule", 1)), _first(generator(seed, "schedule", 1)))


def test_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match="unknown random stream 'shuffle'"):
        generator(0, "shuffle")


@pytest.mark.parametrize("seed", [0, 3])
def test_the_first_epoch_is_not_ordered_by_the_datas_generator(seed):
    # all cold and one input a step: the steps are the data's blocks in the schedule's order
    steps = make_schedule(np.zeros(64, dtype=bool), batch_size=1, order="stream", seed=seed, epoch=0)
    order = [step.spans[0][0][1] for step in steps]
    assert sorted(order) == list(range(64))
    assert order != np.random.default_rng(seed).permutation(64).tolist()  # what a data set seeded so draws
    again = make_schedule(np.zeros(64, dtype=bool), batch_size=1, order="stream", seed=seed, epoch=0)
    assert [step.spans[0][0][1] for step in again] == order


@pytest.mark.parametrize("seed", [0, 3])
def test_the_profile_sample_is_not_the_datas_first_draws(seed):
    data = SyntheticCriteo(4096, batch_size=4096, scale=0.001, seed=seed)
    profiler = AccessProfiler(data.table_configs(), sample_fraction=0.5, seed=seed)
    sampled = profiler.update(next(iter(data)))
    for plain in (np.random.default_rng(seed), np.random.default_rng([seed, 0])):
        agreement = np.mean(sampled == (plain.random(4096) < 0.5))
        assert 0.45 < agreement < 0.55  # independent draws agree about half the time
