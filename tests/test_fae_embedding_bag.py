from dataclasses import replace

import numpy as np
import pytest
import torch
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import FAEEmbeddingBagCollection, HotSet
from fae_torchrec.modules import load_full_state_dict

HOT_IDS = {"t_a": [2, 5], "t_b": list(range(20)), "t_c": [0, 7, 29], "t_d": []}


def _tables(pooling=PoolingType.SUM) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name="t_a", embedding_dim=4, num_embeddings=10, feature_names=["a"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t_b", embedding_dim=8, num_embeddings=20, feature_names=["b"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t_c", embedding_dim=4, num_embeddings=30, feature_names=["c1", "c2"], pooling=pooling
        ),
        EmbeddingBagConfig(
            name="t_d", embedding_dim=4, num_embeddings=6, feature_names=["d"], pooling=pooling
        ),
    ]


def _hot_set(tables) -> HotSet:
    return HotSet(tuple(tables), tuple(np.array(HOT_IDS[t.name], dtype=np.int64) for t in tables))


def _ebc(tables, weighted=False) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables, is_weighted=weighted)
    with torch.no_grad():
        for bag in ebc.embedding_bags.values():
            bag.weight.normal_()
    return ebc


def _batch(kind: str, stride: int = 16, weighted: bool = False, seed: int = 0) -> KeyedJaggedTensor:
    """Multi-hot batch (0-3 ids per bag, some empty) whose ids are all hot, all cold or mixed."""
    rng = np.random.default_rng(seed)
    sizes = {"a": 10, "b": 20, "c1": 30, "c2": 30, "d": 6}
    table = {"a": "t_a", "b": "t_b", "c1": "t_c", "c2": "t_c", "d": "t_d"}
    values, lengths = [], []
    for key, size in sizes.items():
        hot = np.array(HOT_IDS[table[key]], dtype=np.int64)
        cold = np.setdiff1d(np.arange(size), hot)
        pool = {"hot": hot, "cold": cold, "mixed": np.arange(size)}[kind]
        counts = rng.integers(0, 4, stride) if len(pool) else np.zeros(stride, dtype=np.int64)
        lengths.append(counts)
        values.append(rng.choice(pool, counts.sum()) if len(pool) else np.empty(0, np.int64))
    n = int(sum(len(v) for v in values))
    return KeyedJaggedTensor(
        keys=list(sizes),
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)).int(),
        weights=torch.rand(n, generator=torch.Generator().manual_seed(seed)) if weighted else None,
    )


def _split_pair(pooling=PoolingType.SUM, weighted=False):
    """An EBC of the test tables with random weights, and its split by ``HOT_IDS``."""
    tables = _tables(pooling)
    ebc = _ebc(tables, weighted=weighted)
    return ebc, FAEEmbeddingBagCollection.from_ebc(ebc, _hot_set(tables))


def _assert_same_gradients(ebc, split):
    """Each row's gradient in its part is the unsplit row's (a part not called has none: zero); a hot
    row's copy in the cold part gets none."""
    for config, pieces in split._pieces():
        reference = ebc.embedding_bags[config.name].weight.grad
        hot = [ids for ids, _, key in pieces if key.startswith("hot")]
        for ids, weight, _ in pieces:
            grad = torch.zeros_like(weight) if weight.grad is None else weight.grad
            expected = (
                reference[ids]
                if ids is not None
                else reference.index_fill(0, hot[0], 0)
                if hot
                else reference
            )
            torch.testing.assert_close(grad, expected, rtol=0, atol=1e-5)


def _assert_same(expected, actual):
    expected, actual = expected.to_dict(), actual.to_dict()
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-6)


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("kind", ["hot", "cold", "mixed"])
def test_forward_equals_the_original_ebc(pooling, kind):
    ebc, split = _split_pair(pooling)
    for seed in range(3):
        batch = _batch(kind, seed=seed)
        _assert_same(ebc(batch), split(batch))


@pytest.mark.parametrize("kind", ["hot", "cold", "mixed"])
def test_weighted_forward_equals_the_original_ebc(kind):
    ebc, split = _split_pair(weighted=True)
    batch = _batch(kind, weighted=True)
    _assert_same(ebc(batch), split(batch))


def test_tables_live_in_the_parts_that_hold_their_rows():
    tables = _tables()
    split = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    hot = {c.name: c.num_embeddings for c in split.hot.embedding_bag_configs()}
    cold = {c.name: c.num_embeddings for c in split.cold.embedding_bag_configs()}
    assert hot == {"t_a_hot": 2, "t_b_hot": 20, "t_c_hot": 3}, "t_d has no hot row"
    assert cold == {"t_a_cold": 10, "t_c_cold": 30, "t_d_cold": 6}, (
        "every row of a table with cold rows; t_b is all hot"
    )


def test_hot_only_step_never_calls_the_cold_part():
    ebc, split = _split_pair()
    calls = []
    split.cold.register_forward_pre_hook(lambda module, args: calls.append(1))
    batch = _batch("hot")
    _assert_same(ebc(batch), split(batch, hot_only=True))
    assert calls == []
    split(batch)
    assert calls == [1]
    with pytest.raises(ValueError, match="hot_only carries cold ids"):
        split(_batch("mixed"), hot_only=True)


def test_gradients_reach_each_row_in_its_part():
    ebc, split = _split_pair()
    batch = _batch("mixed")
    ebc(batch).values().square().sum().backward()
    split(batch).values().square().sum().backward()
    _assert_same_gradients(ebc, split)


def test_a_cold_step_adds_the_cold_output_into_the_hot_output():
    """No copy of a batch's pooled embeddings: the result is the hot part's output, added to in place,
    and both parts still get the gradients of a sum (every table with hot rows: none is padded)."""
    tables = _tables()[:3]
    ebc = _ebc(tables)
    split = FAEEmbeddingBagCollection.from_ebc(ebc, _hot_set(tables))
    hot_outputs = []
    split.hot.register_forward_hook(lambda module, args, output: hot_outputs.append(output.values()))
    batch = _batch("mixed")
    result = split(batch)
    assert result.values().data_ptr() == hot_outputs[0].data_ptr()
    _assert_same(ebc(batch), result)
    ebc(batch).values().square().sum().backward()
    result.values().square().sum().backward()
    _assert_same_gradients(ebc, split)


def test_round_trip_to_the_original_layout_is_bit_identical():
    tables = _tables()
    ebc, split = _split_pair()
    state = split.ebc_state_dict()
    assert state.keys() == ebc.state_dict().keys()
    for key, value in ebc.state_dict().items():
        assert torch.equal(state[key], value)
    rebuilt = EmbeddingBagCollection(tables)
    rebuilt.load_state_dict(state)
    _assert_same(ebc(_batch("mixed")), rebuilt(_batch("mixed")))


def test_swapped_into_torchrec_dlrm():
    tables = [replace(t, embedding_dim=8) for t in _tables()]
    ebc = _ebc(tables)
    torch.manual_seed(1)
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=3, dense_arch_layer_sizes=[8],
                 over_arch_layer_sizes=[4, 1])  # fmt: skip
    batch = _batch("mixed")
    dense = torch.rand(batch.stride(), 3)
    expected = model(dense, batch)
    model.sparse_arch.embedding_bag_collection = FAEEmbeddingBagCollection.from_ebc(ebc, _hot_set(tables))
    torch.testing.assert_close(model(dense, batch), expected, rtol=0, atol=1e-5)


def test_bad_configurations_are_refused():
    tables = _tables()
    with pytest.raises(ValueError, match="hot set is for other tables"):
        FAEEmbeddingBagCollection(tables[:3], _hot_set(tables))
    with pytest.raises(ValueError, match="weighted features need SUM pooling"):
        mean = _tables(PoolingType.MEAN)
        FAEEmbeddingBagCollection(mean, _hot_set(mean), is_weighted=True)
    split = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    batch = _batch("mixed")
    with pytest.raises(ValueError, match=r"features \['d'\] are missing"):
        split(batch.permute([0, 1, 2, 3]))


def test_load_full_state_dict_into_an_unsharded_module():
    tables = _tables()
    split = FAEEmbeddingBagCollection.from_ebc(_ebc(tables), _hot_set(tables))
    other = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    load_full_state_dict(other, split.state_dict())
    _assert_same(split(_batch("mixed")), other(_batch("mixed")))
    with pytest.raises(KeyError, match="no entry 'hot_rows'"):
        load_full_state_dict(other, {k: v for k, v in split.state_dict().items() if k != "hot_rows"})


def test_split_features_remaps_like_the_hot_set():
    tables = _tables()
    hot_set = _hot_set(tables)
    split = FAEEmbeddingBagCollection(tables, hot_set)
    batch = _batch("mixed", seed=7)
    features = split.split(batch)
    parts = {part: kjt for part, kjt in (("hot", features.hot), ("cold", features.cold)) if kjt is not None}
    original = batch.to_dict()
    for key, table in (("a", "t_a"), ("b", "t_b"), ("c1", "t_c"), ("c2", "t_c"), ("d", "t_d")):
        is_hot, new_ids = hot_set.remap(table, original[key].values().numpy())
        for part, mask in (("hot", is_hot), ("cold", ~is_hot)):
            if part in parts and key in parts[part].keys():
                got = parts[part].to_dict()[key].values().numpy()
                assert np.array_equal(got, new_ids[mask]), (key, part)
            else:
                assert not mask.any(), f"{key} has {part} ids but no {part} KJT carries it"
        assert original[key].lengths().sum() == sum(
            parts[p].to_dict()[key].lengths().sum() for p in parts if key in parts[p].keys()
        )


def _part_ids(batch: KeyedJaggedTensor, hot_set: HotSet) -> KeyedJaggedTensor:
    """``batch`` with its ids as signed part ids, as a partition stores them."""
    table = {"a": "t_a", "b": "t_b", "c1": "t_c", "c2": "t_c", "d": "t_d"}
    features = batch.to_dict()
    values = [
        hot_set.signed_part_ids(table[k], features[k].values().numpy(), feature=k) for k in batch.keys()
    ]
    return KeyedJaggedTensor(
        keys=batch.keys(),
        values=torch.from_numpy(np.concatenate(values)),
        lengths=batch.lengths(),
        weights=batch.weights_or_none(),
    )


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kind", ["hot", "cold", "mixed"])
def test_a_split_by_the_sign_of_part_ids_equals_the_split_by_lookup(weighted, kind):
    tables = _tables()
    hot_set = _hot_set(tables)
    split = FAEEmbeddingBagCollection(tables, hot_set, is_weighted=weighted)
    for seed in range(3):
        batch = _batch(kind, weighted=weighted, seed=seed)
        for is_hot in {None, kind == "hot"}:
            by_lookup, by_sign = (
                split.split(batch, is_hot),
                split.split(_part_ids(batch, hot_set), is_hot, hot_set.digest),
            )
            assert by_sign.is_hot == by_lookup.is_hot
            for expected, actual in ((by_lookup.hot, by_sign.hot), (by_lookup.cold, by_sign.cold)):
                assert actual.keys() == expected.keys()
                for name in ("values", "lengths", "weights_or_none"):
                    torch.testing.assert_close(getattr(actual, name)(), getattr(expected, name)())
                for kjt in (actual, expected):  # given, not computed: it must be the lengths' sums
                    sums = kjt.lengths().view(len(kjt.keys()), -1).sum(1).tolist()
                    assert kjt.length_per_key() == sums
    with pytest.raises(ValueError, match="marked hot_only carries cold ids"):
        split.split(_part_ids(_batch("mixed", weighted=weighted), hot_set), True, hot_set.digest)


def test_part_ids_of_another_hot_set_are_refused():
    tables = _tables()
    hot_set = _hot_set(tables)
    smaller = HotSet(hot_set.tables, tuple(ids[: len(ids) // 2] for ids in hot_set.hot_ids))
    assert smaller.digest != hot_set.digest
    assert HotSet(hot_set.tables, tuple(ids.copy() for ids in hot_set.hot_ids)).digest == hot_set.digest
    split = FAEEmbeddingBagCollection(tables, hot_set)
    with pytest.raises(
        ValueError, match=f"another hot set \\(digest {smaller.digest}\\) than .*'s \\({hot_set.digest}"
    ):
        split.split(_part_ids(_batch("mixed"), smaller), None, smaller.digest)


def test_a_split_by_the_sign_of_part_ids_is_refused_off_the_host():
    tables = _tables()
    hot_set = _hot_set(tables)
    split = FAEEmbeddingBagCollection(tables, hot_set)
    on_device = _part_ids(_batch("mixed"), hot_set).to(torch.device("meta"))
    with pytest.raises(
        ValueError, match="runs on the host, before the batch moves to its device; these ids are on meta"
    ):
        split.split(on_device, None, hot_set.digest)


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("kind", ["hot", "cold", "mixed"])
def test_split_before_the_step_gives_the_same_embeddings_and_gradients(pooling, kind):
    ebc, split = _split_pair(pooling)
    batch = _batch(kind)
    parts = split.split(batch)
    assert parts.is_hot == (kind == "hot") and (parts.cold.values().numel() == 0) == (kind == "hot")
    assert parts.cold.keys() == ["a", "c1", "c2", "d"] and parts.cold.stride() == 16
    calls = []
    split.cold.register_forward_pre_hook(lambda module, args: calls.append(1))
    _assert_same(ebc(batch), split(parts))
    assert len(calls) == (kind != "hot"), "a split hot batch never calls the cold part"
    ebc(batch).values().square().sum().backward()
    split(parts.to(torch.device("cpu"))).values().square().sum().backward()
    _assert_same_gradients(ebc, split)


def test_a_batch_split_as_hot_carries_hot_ids_only():
    tables = _tables()
    split = FAEEmbeddingBagCollection(tables, _hot_set(tables))
    assert split.split(_batch("hot"), is_hot=True).is_hot
    assert not split.split(_batch("hot"), is_hot=False).is_hot, "the router's word wins: a cold step"
    with pytest.raises(ValueError, match="hot_only carries cold ids"):
        split.split(_batch("mixed"), is_hot=True)
