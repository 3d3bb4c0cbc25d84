"""Dry-run FAE plans for CUDA topologies (planned on this CPU-only machine) and planner errors."""

import math

import numpy as np
import pytest
import torch
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheAlgorithm, CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from fae_torchrec import AccessProfiler, FAEEmbeddingBagCollection
from fae_torchrec.data import SyntheticCriteo, SyntheticTaobao
from fae_torchrec.modules.fae_embedding_bag import SLOT_SHARDING_TYPES
from fae_torchrec.stats import estimate_hot_share
from fae_torchrec.train.checkpoint import plan_layout
from planner import FAEShardingPlanner
from planner.baseline import default_planner, dry_run, hbm_planner, scaleup_planner, torchrec_default_plan
from planner.cache_sizing import smallest_load_factors
from planner.cache_statistics import AccessCacheStatistics
from planner.constraints import cold_cache_statistics
from planner.fae_planner import CACHE_SHARE, default_reservation
from planner.sizing_proposer import cold_sizing_search, fits, largest_placed, try_sizing
from planner.topology import make_topology

GIB = 1 << 30
#: UVM caches without the prefetch pipeline (the planner's option for other train pipelines), where the
#: perf model prices a cache by its load factor: tests of the knob's search that need hot rows to pay.
PLAIN_CACHES = CacheParams(prefetch_pipeline=False)
HBM_KERNELS = {EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value}


@pytest.fixture(scope="module")
def kaggle_stats():
    """Statistics of Kaggle-size synthetic data (26 tables, 33.8M rows)."""
    data = SyntheticCriteo(400_000, batch_size=1 << 16, seed=5)
    return data, AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=20_000).profile(data)


def _stats_at_dim(kaggle_stats, dim):
    return kaggle_stats[1].with_embedding_dim(dim)


def _plan(stats, world_size, hbm_cap, budget, cache_params=None):
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap)
    planner = FAEShardingPlanner(
        topology, stats, batch_size=2048, hot_budget_bytes=budget, cache_params=cache_params
    )
    model = FAEEmbeddingBagCollection(stats.tables, planner.choose_hot_set(), device=torch.device("meta"))
    return planner, planner.plan(model, get_default_sharders())


def _check_plan(plan, planner, hbm_cap):
    """Hot parts on HBM; cold parts in UVM caches (or in UVM without a cache where TorchRec cannot fit
    one), or whole in HBM where the cache budget pays for it."""
    hot, cold = plan.plan["hot"], plan.plan["cold"]
    assert {p.compute_kernel for p in hot.values()} <= HBM_KERNELS
    cached = {
        n: p for n, p in cold.items() if p.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    }
    uvm = {n for n, p in cold.items() if p.compute_kernel == EmbeddingComputeKernel.FUSED_UVM.value}
    assert {p.compute_kernel for n, p in cold.items() if n not in cached and n not in uvm} <= HBM_KERNELS
    assert "t_cat_2_cold" in cached, "the largest table's cold part cannot fit in HBM"
    for sharding in cached.values():
        assert isinstance(sharding.cache_params.stats, AccessCacheStatistics)
        assert 0.0 < sharding.cache_params.load_factor < 1.0
    assert max(planner.report.rank_hbm) <= hbm_cap
    hot_set = planner.choose_hot_set()
    assert planner.report.hot_input_share == estimate_hot_share(planner.stats, hot_set).share


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world_size", "dim", "hbm_cap"),
    [(1, 16, 1 * GIB), (8, 16, GIB // 4), (1, 128, 6 * GIB), (8, 128, 1 * GIB)],
)
def test_dry_run_plans_put_hot_rows_on_hbm_and_cold_rows_in_uvm_caches(
    kaggle_stats, world_size, dim, hbm_cap
):
    stats = _stats_at_dim(kaggle_stats, dim)
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap)
    _, _, default_kernels = torchrec_default_plan(stats.tables, topology, batch_size=2048)
    assert EmbeddingComputeKernel.FUSED_UVM_CACHING.value in default_kernels, "TorchRec must need UVM here"
    planner, plan = _plan(stats, world_size, hbm_cap, budget=world_size * hbm_cap // 64)
    _check_plan(plan, planner, hbm_cap)
    assert planner.report.hot_rows["t_cat_2"] > 0


@pytest.mark.slow
def test_the_knob_chooses_a_budget_that_beats_no_hot_rows(kaggle_stats):
    stats = _stats_at_dim(kaggle_stats, 16)
    topology = Topology(world_size=4, compute_device="cuda", hbm_cap=GIB // 4)
    planner = FAEShardingPlanner(
        topology, stats, batch_size=2048, num_candidates=1, cache_params=PLAIN_CACHES
    )
    hot_set = planner.choose_hot_set()
    chosen = planner.report
    assert hot_set.total_hot > 0 and chosen.hot_budget_bytes > 0
    no_hot_rows, _ = _plan(stats, 4, GIB // 4, budget=0, cache_params=PLAIN_CACHES)
    assert chosen.step < no_hot_rows.report.step
    assert "predicted step" in str(chosen) and "rank 3 (host 0): HBM" in str(chosen)


def test_hosts_price_the_distribution_across_them(kaggle_stats):
    """The same 4 GPUs as one host and as two hosts of two (``make_topology``'s ``local_world_size``,
    torchrun's ``LOCAL_WORLD_SIZE``): the report names the hosts and the links TorchRec prices, and the
    input and output distribution that crosses hosts costs more."""
    stats = _stats_at_dim(kaggle_stats, 16)
    reports = {}
    for local in (4, 2):
        topology = make_topology(4, "cuda", GIB // 4, local_world_size=local)
        planner = FAEShardingPlanner(topology, stats, batch_size=2048, hot_budget_bytes=GIB // 16)
        planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
        reports[local] = planner.report
    one, two = reports[4], reports[2]
    assert (one.ranks_per_host, two.ranks_per_host) == (4, 2)
    assert one.links_gibps == two.links_gibps == (600.0, 12.5)
    assert "2 host(s) of 2 rank(s)" in str(two) and "rank 3 (host 1)" in str(two)
    assert sum(two.rank_comms) > sum(one.rank_comms) > 0


@pytest.mark.parametrize(
    ("world_size", "hbm_cap", "dim"),
    [(32, 64 << 20, 16), (1, 256 << 20, 128)],
    ids=["32 GPUs x 64 MiB, dim 16", "1 GPU x 256 MiB, dim 128"],
)
def test_fae_plans_wherever_torchrec_does(kaggle_stats, world_size, hbm_cap, dim):
    """Topologies where FAE found no plan although TorchRec's default planner did (before the fix): the knob
    always tries no hot rows with TorchRec's own choice of kernels, so it finds a plan and predicts a
    step no slower than TorchRec's."""
    stats = _stats_at_dim(kaggle_stats, dim)
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap)
    default = dry_run(default_planner(topology, 2048, tables=stats.tables), stats.tables)
    planner = FAEShardingPlanner(topology, stats, batch_size=2048, hot_budget_bytes=0)
    plan = planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
    assert set(plan.plan) == {"cold"}
    assert planner.report.step <= default.totals.step * (1 + 1e-6)
    if world_size == 1:  # the knob (slower to run at 32 GPUs) finds a plan too, no slower
        knob = FAEShardingPlanner(topology, stats, batch_size=2048, num_candidates=1)
        knob.choose_hot_set()
        assert knob.report.step <= planner.report.step * (1 + 1e-6)


def _torchrec_best(stats, topology, batch_size) -> dict[str, float]:
    """The predicted steps of TorchRec's own plans of the unsplit tables: its default planner and its
    scale-up caches (LRU with and without the prefetch pipeline, LFU), those that place."""
    planners = {
        "default": default_planner(topology, batch_size, tables=stats.tables),
        "scale-up LRU": scaleup_planner(topology, stats, batch_size),
        "scale-up LRU pp": scaleup_planner(topology, stats, batch_size, prefetch_pipeline=True),
        "scale-up LFU": scaleup_planner(topology, stats, batch_size, algorithm=CacheAlgorithm.LFU),
    }
    steps = {}
    for name, planner in planners.items():
        try:
            steps[name] = dry_run(planner, stats.tables).totals.step
        except PlannerError:
            continue
    return steps


@pytest.fixture(scope="module")
def tbsm_stats():
    """Statistics of synthetic Taobao-like data (three tables read by 21 features each, 16 MiB)."""
    data = SyntheticTaobao(5000, batch_size=4096, scale=0.05, seed=0)
    return AccessProfiler(data.table_configs(16), 0.2, seed=0, holdout_size=2000).profile(data)


@pytest.mark.parametrize(("world_size", "torchrec_choice"), [(1, False), (4, True)])
def test_tables_read_by_many_features_are_priced_for_every_feature(tbsm_stats, world_size, torchrec_choice):
    """TorchRec prices a table without pooling factors as one feature, and TBSM's tables are read by
    21 features each: the default planner is told one pooling factor per feature, so where FAE with no
    hot rows keeps TorchRec's own choice of kernels (4 GPUs: none of FAE's cache sizings places) it
    predicts the default's step, and where FAE's own smaller caches place (1 GPU) a shorter one (priced
    as one feature, either step would be a 21st of the other)."""
    tables = tbsm_stats.tables
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=8 << 20)  # model: 16 MiB
    default = dry_run(default_planner(topology, 256, tables=tables), tables)
    assert [len(option.input_lengths) for option in default.options] == [21, 21, 21]
    assert default.kernels[EmbeddingComputeKernel.FUSED.value] < 3, "some table lives outside HBM"
    planner = FAEShardingPlanner(
        topology, tbsm_stats, batch_size=256, hot_budget_bytes=0, cache_params=PLAIN_CACHES
    )
    planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
    if torchrec_choice:
        assert planner.report.step == pytest.approx(default.totals.step, rel=1e-6)
    else:
        assert default.totals.step / 21 < planner.report.step < default.totals.step


@pytest.mark.parametrize("world_size", [1, 4])
def test_caches_shrink_until_they_fit_before_a_cold_part_goes_without_one(tbsm_stats, world_size):
    """TorchRec's storage estimates add buffers that the cache sizing does not count (21 features per
    table here), so caches sized from the whole budget may not place. The knob then sizes them from
    less, and keeps every cold part cached; it used to leave the item table in UVM without a cache."""
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=8 << 20)
    planner = FAEShardingPlanner(topology, tbsm_stats, batch_size=256)
    plan = planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())
    kernels = {name: option.compute_kernel for name, option in plan.plan["cold"].items()}
    assert EmbeddingComputeKernel.FUSED_UVM.value not in kernels.values(), kernels
    assert kernels["t_item_cold"] == EmbeddingComputeKernel.FUSED_UVM_CACHING.value, "the largest table"
    assert all(0 < option.cache_params.load_factor < 1 for option in plan.plan["cold"].values()), plan


def test_cpu_topology_uses_cpu_kernels():
    small = SyntheticCriteo(50_000, batch_size=1 << 14, scale=0.001, seed=1)
    stats = AccessProfiler(small.table_configs(8), 0.2, holdout_size=2000).profile(small)
    planner = FAEShardingPlanner(
        Topology(world_size=2, compute_device="cpu"), stats, batch_size=64, hot_budget_bytes=4096
    )
    model = FAEEmbeddingBagCollection(stats.tables, planner.choose_hot_set(), device=torch.device("meta"))
    plan = planner.plan(model, get_default_sharders())
    kernels = {p.compute_kernel for part in plan.plan.values() for p in part.values()}
    assert kernels <= HBM_KERNELS
    assert all(p.cache_params is None for p in plan.plan["cold"].values())


def test_bad_input_is_a_clear_error(kaggle_stats):
    stats = _stats_at_dim(kaggle_stats, 16)
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=GIB)
    with pytest.raises(ValueError, match="hot budget must be non-negative"):
        FAEShardingPlanner(topology, stats, hot_budget_bytes=-1)
    other = _stats_at_dim(kaggle_stats, 32)
    planner = FAEShardingPlanner(topology, stats, hot_budget_bytes=1 << 20)
    model = FAEEmbeddingBagCollection(other.tables, other.hot_set(1 << 20), device=torch.device("meta"))
    with pytest.raises(ValueError, match="statistics are for other tables"):
        planner.plan(model, get_default_sharders())
    # the reservations leave less than the hot rows (5.6 MiB)
    tiny = Topology(world_size=1, compute_device="cuda", hbm_cap=20 << 20)
    planner = FAEShardingPlanner(tiny, stats, batch_size=2048, hot_budget_bytes=64 << 20)
    model = FAEEmbeddingBagCollection(stats.tables, planner.choose_hot_set(), device=torch.device("meta"))
    with pytest.raises(PlannerError, match=r"topology too small: .* missing [1-9]"):
        planner.plan(model, get_default_sharders())
    with pytest.raises(ValueError, match="its cold part may use kernels"):
        constrained = {"t_cat_2": ParameterConstraints(compute_kernels=["fused"])}
        FAEShardingPlanner(topology, stats, constraints=constrained, hot_budget_bytes=1 << 20).plan(
            FAEEmbeddingBagCollection(stats.tables, stats.hot_set(1 << 20), device=torch.device("meta")),
            get_default_sharders(),
        )


@pytest.mark.slow
def test_user_constraints_and_optimizer_state(kaggle_stats):
    stats = _stats_at_dim(kaggle_stats, 16)
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=GIB // 2)
    with pytest.raises(ValueError, match=r"constraints for unknown tables \['t_cat_3_cold'\]"):
        FAEShardingPlanner(topology, stats, constraints={"t_cat_3_cold": ParameterConstraints()})

    def plan_with(constraints=None, optimizer=None):
        planner = FAEShardingPlanner(
            topology, stats, batch_size=2048, constraints=constraints, hot_budget_bytes=1 << 20,
            optimizer_class=optimizer,
        )  # fmt: skip
        return planner, planner.plan(planner.meta_module(planner.choose_hot_set()), get_default_sharders())

    with pytest.raises(ValueError, match="t_cat_3: its cold part may use sharding types"):
        plan_with({"t_cat_3": ParameterConstraints(sharding_types=["data_parallel"])})
    fixed = {"t_cat_3": ParameterConstraints(cache_params=CacheParams(load_factor=0.05))}
    _, plan = plan_with(fixed)
    assert plan.plan["cold"]["t_cat_3_cold"].cache_params.load_factor == 0.05
    plain = FAEShardingPlanner(topology, stats, hot_budget_bytes=1 << 20)
    adam = FAEShardingPlanner(topology, stats, hot_budget_bytes=1 << 20, optimizer_class=torch.optim.Adam)
    rows, rows_with_state = plain.choose_hot_set().total_hot, adam.choose_hot_set().total_hot
    assert rows_with_state == pytest.approx(rows / 3, rel=0.01), "Adam keeps two more copies of a row"
    module = adam.meta_module(adam.choose_hot_set())
    assert all(p._optimizer_classes == [torch.optim.Adam] for p in module.parameters()), (
        "TorchRec's storage estimate counts the optimizer state of the dry-run module"
    )


def test_report_keeps_only_the_fae_module_tables():
    small = SyntheticCriteo(20_000, batch_size=1 << 14, scale=0.001, seed=1)
    stats = AccessProfiler(small.table_configs(8), 0.2, holdout_size=2000).profile(small)
    planner = FAEShardingPlanner(
        Topology(world_size=2, compute_device="cpu"), stats, batch_size=64, hot_budget_bytes=2048
    )
    other = EmbeddingBagCollection(
        [EmbeddingBagConfig(name="user_id", embedding_dim=8, num_embeddings=100, feature_names=["user"])],
        device=torch.device("meta"),
    )
    model = torch.nn.ModuleDict({"fae": planner.meta_module(planner.choose_hot_set()), "other": other})
    plan = planner.plan(model, get_default_sharders())
    assert "other" in plan.plan
    assert set(planner.report.placements) == {t.name for t in stats.tables}
    assert planner.report.hot_step <= planner.report.cold_step


def test_plan_is_the_same_in_any_call_order_and_repeats_none_of_the_knobs_search(tbsm_stats):
    """After the knob, ``plan`` plans the knob's sizing of its hot set in one run of TorchRec's planner.
    Of a model whose dense layers (256 KiB) take HBM too, so that the knob's sizing no longer places,
    ``plan`` gives the same plan and report whether ``choose_hot_set`` ran before or not (a planner
    without the knob's search sizes that hot set as the knob does first)."""
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=8 << 20)
    knob = FAEShardingPlanner(topology, tbsm_stats, batch_size=256)
    hot_set = knob.choose_hot_set()
    chosen, searched = knob.report, len(knob.torchrec_runs)
    knob.plan(knob.meta_module(hot_set), get_default_sharders())
    assert len(knob.torchrec_runs) == searched + 1
    assert knob.report.placements == chosen.placements and knob.report.step == pytest.approx(chosen.step)

    def model(planner: FAEShardingPlanner) -> nn.Module:
        dense = nn.Linear(256, 256, device=torch.device("meta"))
        return nn.ModuleDict({"sparse": planner.meta_module(hot_set), "dense": dense})

    after_knob = plan_layout(knob.plan(model(knob), get_default_sharders()))
    fresh = FAEShardingPlanner(topology, tbsm_stats, batch_size=256)
    assert plan_layout(fresh.plan(model(fresh), get_default_sharders())) == after_knob
    assert fresh.report.placements == knob.report.placements
    assert fresh.report.step == pytest.approx(knob.report.step, rel=1e-9)


def test_a_cpu_topology_plans_in_one_run_as_it_does_after_the_knob(tbsm_stats):
    """A CPU topology sizes no cache, so ``plan`` runs TorchRec's planner once, with no run on the meta
    module before, and gives the plan it gives after the knob chose the same hot set."""
    topology = Topology(world_size=2, compute_device="cpu")
    knob = FAEShardingPlanner(topology, tbsm_stats, batch_size=256, num_candidates=2)
    hot_set = knob.choose_hot_set()
    assert hot_set.total_hot > 0
    after_knob = plan_layout(knob.plan(knob.meta_module(hot_set), get_default_sharders()))
    fresh = FAEShardingPlanner(topology, tbsm_stats, batch_size=256)
    assert plan_layout(fresh.plan(fresh.meta_module(hot_set), get_default_sharders())) == after_knob
    assert len(fresh.torchrec_runs) == 1
    assert fresh.report.step == pytest.approx(knob.report.step, rel=1e-9)


def test_the_knob_plans_its_budgets_in_worker_processes_as_it_does_here(tbsm_stats):
    """``processes=2``: budgets planned in two worker processes give the hot set, report and runs of
    TorchRec's planner that planning them here one after another gives, ``plan`` still reuses the
    sizing of the knob's choice in one run, and where no budget places, the same error comes back."""
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=8 << 20)
    here = FAEShardingPlanner(
        topology, tbsm_stats, batch_size=256, num_candidates=3, cache_params=PLAIN_CACHES
    )
    workers = FAEShardingPlanner(
        topology, tbsm_stats, batch_size=256, num_candidates=3, processes=2, cache_params=PLAIN_CACHES
    )
    chosen = [planner.choose_hot_set() for planner in (here, workers)]
    assert chosen[0].total_hot > 0
    assert all(map(np.array_equal, chosen[0].hot_ids, chosen[1].hot_ids))
    assert workers.report.placements == here.report.placements and workers.report.step == here.report.step
    assert len(workers.torchrec_runs) == len(here.torchrec_runs) > 4
    assert workers.sizings_tried == here.sizings_tried
    workers.plan(workers.meta_module(chosen[1]), get_default_sharders())
    assert len(workers.torchrec_runs) == len(here.torchrec_runs) + 1
    tiny = Topology(world_size=1, compute_device="cuda", hbm_cap=1 << 20)  # no budget places
    errors = []
    for processes in (1, 2):
        planner = FAEShardingPlanner(tiny, tbsm_stats, batch_size=256, num_candidates=2, processes=processes)
        with pytest.raises(PlannerError, match="topology too small") as raised:
            planner.choose_hot_set()
        errors.append((str(raised.value), raised.value.error_type, len(planner.torchrec_runs)))
    assert errors[0] == errors[1]
    with pytest.raises(ValueError, match="processes must be at least 1, got 0"):
        FAEShardingPlanner(topology, tbsm_stats, processes=0)


def _drive(search, places):
    """Run a sizing search, answering each sizing with ``places(sizing)``: the sizings it yields and
    what it returns."""
    tried = []
    try:
        sizing = next(search)
        while True:
            tried.append(sizing)
            sizing = search.send(places(sizing))
    except StopIteration as stop:
        return tried, stop.value


@pytest.mark.parametrize("count", [1, 2, 3, 6, 7])
def test_largest_placed_finds_the_largest_sizing_that_places_in_few_tries(count):
    """For every threshold (sizings from ``largest`` on place, none above it), ``largest_placed``
    places that one and no larger, in at most 2 + log2(count) tries (trying each in turn took up to
    ``count``)."""
    sizings = [({"i": float(i)}, {}) for i in range(count)]
    for largest in range(count + 1):  # count: none places
        unplaced = []

        def place(sizing, unplaced=unplaced):
            return try_sizing(sizing, unplaced, lambda mine, other: False)

        tried, placed = _drive(
            largest_placed(sizings, place), lambda s, largest=largest: s[0]["i"] >= largest
        )
        indices = [int(s[0]["i"]) for s in tried]
        assert placed == (largest < count)
        assert placed == (largest in indices), indices  # the largest that places was tried
        assert len(indices) == len(set(indices)) <= 2 + math.ceil(math.log2(count)), indices


def test_the_sizing_search_tries_smaller_caches_only_where_larger_ones_do_not_place():
    """``cold_sizing_search``: a known sizing alone where it places; else whole parts, then full caches,
    then the largest smaller caches that place and the uncached sizing; a sizing asking at least what an
    unplaced one asked is not tried."""
    whole, full, smaller = {"t": 1.0}, {"t": 0.8}, [{"t": 0.6}, {"t": 0.4}, {"t": 0.2}]

    def at_least(mine, other):
        return mine["t"] >= other["t"]

    def search(known=None):
        return cold_sizing_search(known, whole, full, smaller, at_least)

    assert _drive(search(({"t": 0.5}, {})), lambda s: True)[0] == [({"t": 0.5}, {})]
    assert _drive(search(), lambda s: True)[0] == [(whole, {})]
    assert _drive(search(), lambda s: s[0] != whole)[0] == [(whole, {}), (full, {})]
    tried, _ = _drive(search(({"t": 0.9}, {})), lambda s: s[0]["t"] <= 0.4 or s[1] == {"uncached": True})
    # the known 0.9 fails, so whole (asking more) is not tried; full is, and fails
    assert tried == [
        ({"t": 0.9}, {}),
        (full, {}),
        ({"t": 0.6}, {}),
        ({"t": 0.2}, {}),
        ({"t": 0.4}, {}),
        (full, {"uncached": True}),
    ]


def test_no_cache_sizing_that_asks_more_than_an_unplaced_one_is_planned():
    """At 16 GPUs the global batch of 32,768 inputs reads nearly every cold row of these small tables,
    so no cache may be smaller than almost its whole part: TorchRec cannot place the cold parts whole
    in HBM, and every cache sizing asks more of each table (the part's rows, and the cache's
    bookkeeping), so none is tried. The skipped sizing does fail in TorchRec's planner."""
    data = SyntheticCriteo(50_000, batch_size=1 << 16, scale=0.01, seed=0)
    stats = AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=2000).profile(data)
    topology = Topology(world_size=16, compute_device="cuda", hbm_cap=16 << 20)
    planner = FAEShardingPlanner(topology, stats, batch_size=2048, hot_budget_bytes=0)
    hot_set = planner.choose_hot_set()
    module = planner.meta_module(hot_set)
    plan = planner.plan(module, get_default_sharders())
    # in HBM whole (fails), then in UVM with or without a cache (places); then plan places that in one
    # run, TorchRec's default planner's configuration or FAE's
    (whole, whole_placed), (uncached, uncached_placed), *_ = planner.sizings_tried
    assert set(whole[0].values()) == {1.0} and not whole_placed
    assert uncached[1] == {"uncached": True} and uncached_placed
    assert planner.report.torchrec_config is None or planner.report.torchrec_config.startswith("default")
    assert plan.plan["cold"]
    # the full sizing (every cold part cached at the uncached sizing's load factors), not tried, fails
    full = planner._cold_setting(module, hot_set).constraints(uncached[0])
    with pytest.raises(PlannerError):
        planner._torchrec_plan(module, get_default_sharders(), full)


def test_the_sizings_searched_in_one_run_plan_as_each_alone():
    """The search in one run of TorchRec's planner (``SizingProposer``) keeps, for each sizing that
    places, the plan TorchRec's planner makes of that sizing alone, and each sizing it answers "not
    placed" (ruled out by storage, ``fits``, or by partitioning its proposals) fails alone as well.
    At 8 GPUs x 4 MiB whole parts and full caches do not place, and the bisection among smaller caches
    both places and fails; TorchRec's storage estimates alone rule out some of those that fail, never
    one that places."""
    data = SyntheticCriteo(50_000, batch_size=1 << 16, scale=0.01, seed=0)
    stats = AccessProfiler(data.table_configs(), 0.05, seed=0, holdout_size=2000).profile(data)
    topology = Topology(world_size=8, compute_device="cuda", hbm_cap=4 << 20)
    planner = FAEShardingPlanner(topology, stats, batch_size=512, hot_budget_bytes=0)
    hot_set = planner.choose_hot_set()
    module, sharders = planner.meta_module(hot_set), get_default_sharders()
    setting = planner._cold_setting(module, hot_set)
    candidates = planner._sized_plans(module, sharders, setting, None, [])
    assert len(planner.torchrec_runs) == 1
    tried = planner.sizings_tried
    assert [placed for _, placed in tried].count(False) >= 3 and [p for _, p in tried].count(True) >= 2, tried
    placed_plans = {id(sizing): plan for plan, _, _, sizing in candidates}
    capacity = default_reservation().reserve(
        topology, 512, module, sharders, setting.constraints(tried[0][0][0], **tried[0][0][1])
    )
    ruled_out = []
    for sizing, placed in tried:
        constraints = setting.constraints(sizing[0], **sizing[1])
        storage = planner._enumerator(constraints, storage_only=True).enumerate(module, sharders)
        ruled_out.append(not fits(storage, capacity))
        assert not (placed and ruled_out[-1]), sizing
        if placed:
            alone, _, _ = planner._torchrec_plan(module, sharders, constraints)
            assert str(alone) == str(placed_plans[id(sizing)])
        else:
            with pytest.raises(PlannerError):
                planner._torchrec_plan(module, sharders, constraints)
    assert any(ruled_out), tried


@pytest.mark.parametrize(
    ("stats_name", "world_size", "hbm_cap", "batch_size"),
    [("tbsm", 1, 8 << 20, 256), ("tbsm", 4, 8 << 20, 256), ("kaggle", 8, GIB // 4, 2048)],
    ids=["TBSM 1 GPU x 8 MiB", "TBSM 4 GPUs x 8 MiB", "Kaggle 8 GPUs x 256 MiB"],
)
def test_the_knob_is_predicted_no_slower_than_torchrecs_best(
    request, stats_name, world_size, hbm_cap, batch_size
):
    """The knob plans its caches for the prefetch pipeline, as TorchRec's strongest offload, and tries
    no hot rows with TorchRec's own default and scale-up plans among its candidates: by TorchRec's perf
    model its choice is never slower than any of TorchRec's plans of the unsplit tables (at 4 GPUs x 8
    MiB the scale-up planner places none: its smallest caches, one global batch's rows, do not fit)."""
    stats = request.getfixturevalue(f"{stats_name}_stats")
    stats = stats if stats_name == "tbsm" else stats[1]
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=hbm_cap)
    torchrec = _torchrec_best(stats, topology, batch_size)
    assert "default" in torchrec and ("scale-up LRU pp" in torchrec) == (world_size != 4), torchrec
    knob = FAEShardingPlanner(topology, stats, batch_size=batch_size, num_candidates=1)
    knob.choose_hot_set()
    assert knob.report.step <= min(torchrec.values()) * (1 + 1e-4), (knob.report.step, torchrec)


@pytest.mark.slow
def test_scaleup_keeps_in_hbm_the_tables_a_cache_would_hold_whole(kaggle_stats):
    """TorchRec's strongest offload (b) caches what it must: a table whose smallest cache (one global
    batch's distinct rows) would hold it whole, the 3-row table among them, stays in HBM, data-parallel
    where TorchRec chooses; every other table gets an LRU cache with the access statistics, planned for
    the prefetch pipeline, which the scale-up proposer grows."""
    stats = _stats_at_dim(kaggle_stats, 16)
    topology = Topology(world_size=8, compute_device="cuda", hbm_cap=GIB // 4)
    caches = cold_cache_statistics(stats, stats.hot_set(0), 2048 * 8)
    whole = {name for name, factor in smallest_load_factors(caches).items() if factor == 1.0}
    assert "t_cat_8" in whole and len(whole) < len(stats.tables)
    planned = dry_run(scaleup_planner(topology, stats, 2048, prefetch_pipeline=True), stats.tables)
    shardings = planned.plan.plan[""]
    assert all(shardings[name].compute_kernel in HBM_KERNELS for name in whole)
    assert "data_parallel" in {shardings[name].sharding_type for name in whole}
    cached = [
        s for s in shardings.values() if s.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    ]
    assert cached and all(s.cache_params.prefetch_pipeline for s in cached)
    assert all(isinstance(s.cache_params.stats, AccessCacheStatistics) for s in cached)


def test_a_plans_step_in_hbm_prices_its_own_layout_without_transfers(tbsm_stats):
    """``dry_run`` prices the plan's layout again with its UVM tables in HBM: below the planned step where
    a table is in UVM, the planned step itself where every table is in HBM already."""
    topology = Topology(world_size=1, compute_device="cuda", hbm_cap=8 << 20)
    default = dry_run(default_planner(topology, 256, tables=tbsm_stats.tables), tbsm_stats.tables)
    assert default.kernels[EmbeddingComputeKernel.FUSED.value] < 3, "some table lives outside HBM"
    assert 0 < default.step_in_hbm < default.totals.step
    roomy = Topology(world_size=1, compute_device="cuda", hbm_cap=1 << 30)
    in_hbm = dry_run(hbm_planner(roomy, tbsm_stats.tables, 256), tbsm_stats.tables)
    assert in_hbm.step_in_hbm == pytest.approx(in_hbm.totals.step, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("compute_device", ["cuda", "cpu"])
def test_a_planned_cold_tiers_slots_get_the_caches_memory_and_plan_as_plain_rows(
    kaggle_stats, compute_device
):
    """``cold_slot_budget`` gives the slot rows what TorchRec's reservation and its estimate of the other
    parts leave (none on CPU): more than the cold caches may take (a slot needs no cache headroom), less
    than all the hot rows leave; and TorchRec, unconstrained by the user, plans slot tables of that size
    on the fused kernel in whole-row shards, within the device memory."""
    stats = _stats_at_dim(kaggle_stats, 128)
    hbm_cap = GIB
    topology = Topology(world_size=8, compute_device=compute_device, hbm_cap=hbm_cap)
    planner = FAEShardingPlanner(topology, stats, batch_size=2048, hot_budget_bytes=GIB // 8)
    hot_set = planner.choose_hot_set()
    budget = planner.cold_slot_budget(hot_set)
    cold_rows = {
        c.name: c.num_embeddings - len(h) for c, h in zip(stats.tables, hot_set.hot_ids, strict=True)
    }
    cold_rows = {name: rows for name, rows in cold_rows.items() if rows}
    if compute_device == "cpu":
        assert budget is None
        slots = dict.fromkeys(cold_rows, 4096)
    else:
        memory = float(planner.device_memory(planner.meta_module(hot_set)).sum())
        assert CACHE_SHARE * (memory - hot_set.hot_bytes()) < budget < memory - hot_set.hot_bytes()
        row_bytes = stats.layout.row_bytes()[0]  # dim 128, every table
        slots = {
            name: min(rows, int(budget / len(cold_rows) / row_bytes)) for name, rows in cold_rows.items()
        }
    model = FAEEmbeddingBagCollection(stats.tables, hot_set, device=torch.device("meta"), cold_slots=slots)
    plan = planner.plan(model, get_default_sharders())
    cold = plan.plan["cold"]
    assert {p.compute_kernel for p in cold.values()} == {EmbeddingComputeKernel.FUSED.value}
    assert {p.sharding_type for p in cold.values()} <= set(SLOT_SHARDING_TYPES)
    if compute_device == "cuda":
        assert max(planner.report.rank_hbm) <= hbm_cap


@pytest.mark.slow
def test_a_planned_cold_tiers_copies_are_priced_and_spread_over_the_ranks(kaggle_stats):
    """``slot_copies`` adds each slot table's copies per cold step, over the host-device link, to its
    shards' ``prefetch_compute`` (``SlotCopyEstimator``): the predicted cold step carries them and the
    step in HBM does not, and TorchRec's partitioner moves apart two tables it had put on one rank once
    they copy."""
    stats = _stats_at_dim(kaggle_stats, 128)
    topology = Topology(world_size=2, compute_device="cuda", hbm_cap=GIB)
    planner = FAEShardingPlanner(topology, stats, batch_size=2048, hot_budget_bytes=GIB // 8)
    hot_set = planner.choose_hot_set()
    slots = {
        c.name: min(c.num_embeddings - len(h), 4096)
        for c, h in zip(stats.tables, hot_set.hot_ids, strict=True)
        if c.num_embeddings > len(h)
    }

    def planned() -> dict:
        model = FAEEmbeddingBagCollection(
            stats.tables, hot_set, device=torch.device("meta"), cold_slots=slots
        )
        return planner.plan(model, get_default_sharders()).plan["cold"]

    def whole_on(sharding) -> int | None:
        return sharding.ranks[0] if sharding.sharding_type == "table_wise" else None

    before = planned()
    assert planner.report.cold_step < 1.0, "lookups of a few thousand slots a table"
    on_rank = {}
    for name, sharding in before.items():
        on_rank.setdefault(whole_on(sharding), []).append(name)
    first, second = next(names for rank, names in on_rank.items() if rank is not None and len(names) > 1)[:2]
    ten_ms = 10 * topology.hbm_to_ddr_mem_bw  # bytes that take 10 ms to cross the link
    planner.slot_copies = {name.removesuffix("_cold"): ten_ms for name in (first, second)}
    after = planned()
    assert 10.0 < planner.report.cold_step < 11.0, "one table's copies on the slowest rank"
    assert planner.report.cold_step_in_hbm < 1.0, "the step in HBM leaves the transfers out"
    assert whole_on(after[first]) is None or whole_on(after[first]) != whole_on(after[second])
