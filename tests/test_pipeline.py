"""FAE on TorchRec's train pipeline: ``FAETrainPipeline`` trains the model the plain loop and the
pipelined baseline train, and a hot step starts no input distribution and no lookup of the cold part.
``FAEPrefetchTrainPipeline`` (TorchRec's prefetch pipeline, CUDA only) is checked as far as a CPU can
run it: it fills with TorchRec's stages and leaves the cold part out of hot batches, and FAE's planner
plans every cold cache for it unless told otherwise (a CUDA dry run).

Three models from the same initial weights, on the same batches in the same order (24 steps, hot and
cold interleaved), under DistributedModelParallel on gloo: the unsplit DLRM on TorchRec's stock
``TrainPipelineSparseDist``, FAE on ``FAETrainPipeline`` (batches split by the router), and FAE in the
plain loop (``train_step``). The planners' plans are unconstrained (TorchRec makes small tables and
hot parts data-parallel).
"""

import itertools
import warnings

import pytest
import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    get_default_sharders,
    table_wise,
)
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.types import CacheAlgorithm, CacheParams, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import FAEEmbeddingBagCollection
from fae_torchrec.data.criteo import DEFAULT_CAT_NAMES
from fae_torchrec.modules.state import gather_full_state_dict
from fae_torchrec.train.evaluation import evaluate, validation_batches
from fae_torchrec.train.optimizers import EmbeddingOptimizer
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.pipeline import FAEPrefetchTrainPipeline, FAETrainPipeline
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.runner import StepRunner, steps_to_pause
from fae_torchrec.train.step import train_step
from planner import FAEShardingPlanner
from planner.baseline import default_planner
from tests.distributed import run_on_ranks
from tests.test_equivalence import OPTIMIZERS, PREFIXES, STEPS, _model, _setup, _shard

PREFIX = PREFIXES["dlrm"]

CPU = torch.device("cpu")


def _run(pipeline, batches) -> int:
    """Train on every batch; how many steps ran."""
    steps, iterator = 0, iter(batches)
    while True:
        try:
            pipeline.progress(iterator)
        except StopIteration:
            return steps
        steps += 1


def _events(calls: dict[str, tuple]) -> list[str]:
    """The order in which the named methods (``name: (module, method)``) are called from now on."""
    events: list[str] = []
    for name, (module, method) in calls.items():
        original = getattr(module, method)

        def recorded(*args, _name=name, _original=original, **kwargs):
            events.append(_name)
            return _original(*args, **kwargs)

        setattr(module, method, recorded)
    return events


def _hot_runs(kinds: list[bool]) -> list[int]:
    """The lengths of the runs of hot steps between two cold ones."""
    colds = [i for i, hot in enumerate(kinds) if not hot]
    return [b - a - 1 for a, b in itertools.pairwise(colds)]


def _pipelined_training(
    rank: int, world_size: int, optimizer_name: str, first_hot: bool, lookahead: int = 0
) -> None:
    optimizer, kwargs, tolerance = OPTIMIZERS[optimizer_name]
    embedding = EmbeddingOptimizer(optimizer, kwargs)
    data, tables, stats, hot_set = _setup("dlrm", world_size)
    topology = Topology(world_size=world_size, compute_device="cpu")
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables)
    models = {"baseline": _model("dlrm", ebc)}
    for name in ("pipelined", "loop"):
        models[name] = _model("dlrm", FAEEmbeddingBagCollection.from_ebc(ebc, hot_set))
        models[name].load_state_dict(models["baseline"].state_dict(), strict=False)
    base_dmp, base_optimizer, _ = _shard(
        models["baseline"], PREFIX, EmbeddingShardingPlanner(topology, batch_size=32), embedding
    )
    fae = {
        name: _shard(
            models[name],
            PREFIX,
            FAEShardingPlanner(topology, stats, batch_size=32, hot_budget_bytes=48 << 10),
            embedding,
        )
        for name in ("pipelined", "loop")
    }

    partition = HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES)
    # the shuffled order: it has runs of hot steps, so a hot step also follows a hot step
    router = BatchRouter(partition, 32, world_size=world_size, rank=rank, order="shuffled", seed=1)
    routed = list(router.epoch(0))
    start = next(i for i, r in enumerate(routed) if r.hot == first_hot)
    routed = routed[start : start + STEPS]
    kinds = [r.hot for r in routed]
    assert kinds[0] == first_hot and any(kinds) and not all(kinds)
    assert any(a and b for a, b in itertools.pairwise(kinds)), "a hot step follows a hot step"
    split_module = fae["pipelined"][0].module.model.sparse_arch.embedding_bag_collection
    split_batches = [
        type(r.batch)(
            r.batch.dense_features, split_module.split(r.batch.sparse_features, r.hot), r.batch.labels
        )
        for r in routed
    ]

    cold = split_module.cold
    steps = "compute_and_output_dist"
    events = _events({"cold dist": (cold, "input_dist"), "hot step": (split_module.hot, steps),
                      "cold step": (cold, steps)})  # fmt: skip
    pipeline = FAETrainPipeline(fae["pipelined"][0], fae["pipelined"][1], CPU, lookahead=lookahead)
    assert _run(pipeline, split_batches) == STEPS
    assert {id(m) for m in pipeline._pipelined_modules} == {id(split_module.hot), id(cold)}, (
        "both parts pipelined"
    )
    num_cold = kinds.count(False)
    assert events.count("cold step") == num_cold, "the cold part looks up on cold steps only"
    assert events.count("cold dist") == num_cold + first_hot, (
        "and distributes inputs for them (and a first batch)"
    )
    # the hot steps between a cold step and the next cold batch's input distribution: none with a
    # look-ahead; without one TorchRec starts it during the step just before that batch
    dists = [i for i, event in enumerate(events) if event == "cold dist"][first_hot:]  # one per cold batch
    colds = [i for i, event in enumerate(events) if event == "cold step"]
    waited = {
        gap: events[colds[j] : dists[j + 1]].count("hot step")
        for j, gap in enumerate(_hot_runs(kinds))
        if gap >= 2  # with fewer hot steps between, both start it before any of them
    }
    assert waited, kinds
    assert waited == {gap: 0 if lookahead else gap - 1 for gap in waited}, (waited, kinds)

    assert _run(TrainPipelineSparseDist(base_dmp, base_optimizer, CPU), [r.batch for r in routed]) == STEPS
    loop_dmp, loop_optimizer, _ = fae["loop"]
    for step in routed:
        train_step(loop_dmp, step.batch, loop_optimizer)

    expected = gather_full_state_dict(base_dmp)
    for name in ("pipelined", "loop"):
        actual = gather_full_state_dict(fae[name][0])
        split = fae[name][0].module.model.sparse_arch.embedding_bag_collection
        for key, value in split.ebc_state_dict(actual, prefix=PREFIX).items():
            torch.testing.assert_close(
                value, expected[PREFIX + key], rtol=0, atol=tolerance, msg=f"{name} {key}"
            )
        for key, value in expected.items():
            if "embedding_bag" not in key:
                torch.testing.assert_close(actual[key], value, rtol=0, atol=tolerance, msg=f"{name} {key}")


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_pipelined_fae_trains_the_baseline_model(tmp_path, world_size):
    """Adagrad here; the tests below train with RowWiseAdagrad (the optimizers' own exactness under the
    split is test_equivalence's)."""
    run_on_ranks(_pipelined_training, world_size, tmp_path, "adagrad", False)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_first_hot_batch_creates_the_cold_input_dist(tmp_path, world_size):
    run_on_ranks(_pipelined_training, world_size, tmp_path, "rowwise_adagrad", True)


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "first_hot"), [(1, False), (2, True)])
def test_the_look_ahead_starts_the_next_cold_batch_during_the_hot_steps_before_it(
    tmp_path, world_size, first_hot
):
    """With ``lookahead`` the pipeline reads ahead and starts the next cold batch's cold input
    distribution once the cold step before it is done, before the hot steps between them; it still
    trains the baseline's model and the plain loop's, and distributes each cold batch's inputs once."""
    run_on_ranks(_pipelined_training, world_size, tmp_path, "rowwise_adagrad", first_hot, 8)


def _runner_pauses(rank: int, world_size: int) -> None:
    """Train the same routed steps with ``StepRunner`` on the pipeline and in the plain loop, pausing
    for an evaluation every 5 steps as the training recipe does (``steps_to_pause``)."""
    data, tables, stats, hot_set = _setup("dlrm", world_size)
    topology = Topology(world_size=world_size, compute_device="cpu")
    validation = validation_batches(next(data.blocks()), DEFAULT_CAT_NAMES, 32, world_size, rank)
    partition = HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES)
    runs = {}
    for kind in ("sparse", "none"):
        torch.manual_seed(0)
        model = _model("dlrm", FAEEmbeddingBagCollection(tables, hot_set))
        planner = FAEShardingPlanner(topology, stats, batch_size=32, hot_budget_bytes=48 << 10)
        dmp, optimizer, _ = _shard(model, PREFIX, planner, EmbeddingOptimizer(*OPTIMIZERS["adagrad"][:2]))
        split = dmp.module.model.sparse_arch.embedding_bag_collection
        router = BatchRouter(partition, 32, world_size, rank, order="shuffled", seed=1, split=split.split)
        runner, steps = StepRunner(kind, dmp, optimizer, CPU, fae=True), router.epoch(0)
        trained, evaluations = [], []
        while len(trained) < STEPS:
            segment = itertools.islice(steps, steps_to_pause(len(trained), STEPS - len(trained), 5))
            trained += [(routed.hot, loss) for routed, loss, _, _ in runner.train(segment)]
            evaluations.append(evaluate(runner.paused(), validation))
        runs[kind] = trained, evaluations, gather_full_state_dict(dmp)
    (piped, piped_evaluations, piped_state), (plain, plain_evaluations, plain_state) = runs.values()
    assert len(piped_evaluations) == 5 and len(piped) == STEPS, "the pipeline drains at each pause"
    assert [hot for hot, _ in piped] == [hot for hot, _ in plain] and any(h for h, _ in plain)
    torch.testing.assert_close([loss for _, loss in piped], [loss for _, loss in plain], rtol=0, atol=1e-5)
    for piped_result, plain_result in zip(piped_evaluations, plain_evaluations, strict=True):
        assert piped_result == pytest.approx(plain_result, abs=1e-5)
    for key, value in plain_state.items():
        torch.testing.assert_close(piped_state[key], value, rtol=0, atol=1e-5, msg=key)


def test_the_step_runner_pauses_the_pipeline_where_the_plain_loop_evaluates(tmp_path):
    """``StepRunner``: the pipeline reads ahead, yet each pause sees the model the plain loop has there."""
    run_on_ranks(_runner_pauses, 1, tmp_path)


def _fae_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The messages of the caught warnings the split module gives about a plan or a pipeline."""
    kinds = ("hot tables planned out of device memory", "the cold part is pipelined")
    return [str(w.message) for w in caught if str(w.message).startswith(kinds)]


def _misuses_warn_once(rank: int, world_size: int) -> None:
    """FAE's plan on FAE's pipeline warns of nothing; TorchRec's own pipeline, and a plan that puts a hot
    table on a UVM kernel (as TorchRec's planner may on a GPU), each warn once, at the first step."""
    data, tables, stats, hot_set = _setup("dlrm", world_size)
    partition = HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES)
    topology = Topology(world_size=world_size, compute_device="cpu")
    uvm = EmbeddingComputeKernel.FUSED_UVM_CACHING.value

    def sharded(plan_of) -> tuple:
        torch.manual_seed(0)
        model = _model("dlrm", FAEEmbeddingBagCollection(tables, hot_set))
        dmp, optimizer, _ = _shard(
            model, PREFIX, plan_of(model), EmbeddingOptimizer(torch.optim.SGD, {"lr": 0.1})
        )
        split = dmp.module.model.sparse_arch.embedding_bag_collection
        router = BatchRouter(partition, 32, world_size, rank, order="shuffled", seed=1, split=split.split)
        return dmp, optimizer, [routed.batch for routed in itertools.islice(router.epoch(0), 6)]

    def hand_built(model) -> ShardingPlan:
        """Every part table-wise on rank 0, the hot part's on a UVM cache."""
        fae = model.model.sparse_arch.embedding_bag_collection
        return ShardingPlan({
            PREFIX + part: construct_module_sharding_plan(
                getattr(fae, part),
                {c.name: table_wise(0, compute_kernel=uvm if part == "hot" else None)
                 for c in getattr(fae, part).embedding_bag_configs()},
                world_size=world_size, device_type="cpu",
            )
            for part in ("hot", "cold")
        })  # fmt: skip

    fae_planner = FAEShardingPlanner(topology, stats, batch_size=32)
    runs = {
        "FAE": (lambda model: fae_planner, FAETrainPipeline),
        "TorchRec's pipeline": (lambda model: fae_planner, TrainPipelineSparseDist),
        "a hot part on UVM": (lambda model: _FixedPlan(hand_built(model)), FAETrainPipeline),
    }
    found = {}
    for name, (plan_of, pipeline_class) in runs.items():
        dmp, optimizer, batches = sharded(plan_of)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _run(pipeline_class(dmp, optimizer, CPU), batches) == len(batches)
        found[name] = _fae_warnings(caught)
    assert found["FAE"] == []
    assert len(found["TorchRec's pipeline"]) == 1, found
    assert "TrainPipelineSparseDist" in found["TorchRec's pipeline"][0]
    assert len(found["a hot part on UVM"]) == 1, found
    hot_tables = [name for name, rows in hot_set.num_hot.items() if rows]
    assert hot_tables and all(f"{name}_hot: {uvm}" in found["a hot part on UVM"][0] for name in hot_tables)


class _FixedPlan:
    """A planner whose plan is given (``_shard`` plans through ``collective_plan``)."""

    def __init__(self, plan: ShardingPlan) -> None:
        self.plan = plan

    def collective_plan(self, *args) -> ShardingPlan:
        return self.plan


def test_misused_plans_and_pipelines_warn_once(tmp_path):
    run_on_ranks(_misuses_warn_once, 1, tmp_path)


def _prefetch_pipeline_fills(rank: int, world_size: int) -> None:
    data, tables, stats, hot_set = _setup("dlrm", world_size)
    torch.manual_seed(0)
    model = _model("dlrm", FAEEmbeddingBagCollection(tables, hot_set))
    planner = FAEShardingPlanner(
        Topology(world_size=world_size, compute_device="cpu"), stats, batch_size=32, hot_budget_bytes=48 << 10
    )
    dmp, optimizer, _ = _shard(model, PREFIX, planner, EmbeddingOptimizer(torch.optim.SGD, {"lr": 0.1}))
    split = dmp.module.model.sparse_arch.embedding_bag_collection
    router = BatchRouter(HotColdPartition.of(data.blocks(), hot_set, DEFAULT_CAT_NAMES), 32, world_size, rank,
                         split=split.split)  # fmt: skip
    routed = list(router.epoch(0))
    for kinds in ([False, True], [True, True], [True, False]):  # the first two batches of a fill
        batches = [next(r for r in routed if r.hot == kind).batch for kind in kinds]
        pipeline = FAEPrefetchTrainPipeline(dmp, optimizer, CPU)
        assert isinstance(pipeline, PrefetchTrainPipelineSparseDist)
        input_dists = _events({"cold dist": (split.cold, "input_dist")})
        pipeline.fill_pipeline(iter(batches))  # TorchRec's stages up to the first step's forward
        assert len(pipeline.batches) == 2
        assert len(input_dists) == 1 + (not kinds[1]), "the first batch, and the second if it is cold"
        del split.cold.input_dist  # the module's own method again
        for context in pipeline.contexts:  # gloo work left in flight at exit aborts the process
            pipeline.wait_sparse_data_dist(context)
            for request in context.input_dist_tensors_requests.values():
                request.wait()
        pipeline.detach()


@pytest.mark.slow
def test_the_prefetch_pipeline_leaves_the_cold_part_out_of_hot_batches(tmp_path):
    run_on_ranks(_prefetch_pipeline_fills, 2, tmp_path)


def _cold_caches(planner: FAEShardingPlanner) -> dict[str, CacheParams]:
    """The ``CacheParams`` of the cold parts the planner puts in a UVM cache, by part table."""
    plan = planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
    caching = EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    return {n: p.cache_params for n, p in plan.plan["cold"].items() if p.compute_kernel == caching}


def test_cold_caches_are_planned_for_the_prefetch_pipeline_unless_told_otherwise():
    """A CUDA dry run: by default every cold part that FAE's planner puts in a UVM cache gets
    ``prefetch_pipeline=True``, which is what ``FAEPrefetchTrainPipeline`` needs; ``cache_params``
    plans them for another pipeline and another algorithm, and a table's own ``CacheParams`` in the
    constraints win over it. TorchRec's default planner of the unsplit tables, given the same
    constraints, pipelines its caches too."""
    _, tables, stats, _ = _setup("dlrm", 1)
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=512 << 10)
    pipelined = _cold_caches(FAEShardingPlanner(topology, stats, batch_size=32, hot_budget_bytes=16 << 10))
    assert pipelined, "some cold part is in a UVM cache"
    assert all(p.prefetch_pipeline for p in pipelined.values())
    lfu = CacheParams(prefetch_pipeline=False, algorithm=CacheAlgorithm.LFU)
    table = min(pipelined).removesuffix("_cold")  # a table with a cold cache; its own CacheParams: LRU
    lru_table = {table: ParameterConstraints(cache_params=CacheParams(algorithm=CacheAlgorithm.LRU))}
    plain = _cold_caches(
        FAEShardingPlanner(
            topology, stats, batch_size=32, hot_budget_bytes=16 << 10, cache_params=lfu, constraints=lru_table
        )
    )
    assert f"{table}_cold" in plain and len(plain) > 1
    assert not any(p.prefetch_pipeline for p in plain.values())
    assert {n: p.algorithm for n, p in plain.items()} == {
        n: CacheAlgorithm.LRU if n == f"{table}_cold" else CacheAlgorithm.LFU for n in plain
    }
    # the baseline the example pairs with it: TorchRec's default planner, its caches pipelined
    baseline = default_planner(
        topology, 32, tables=tables, cache_params=CacheParams(prefetch_pipeline=True)
    ).plan(EmbeddingBagCollection(tables, device=torch.device("meta")), get_default_sharders())
    cached = [
        p
        for p in baseline.plan[""].values()
        if p.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    ]
    assert cached and all(p.cache_params.prefetch_pipeline for p in cached)
