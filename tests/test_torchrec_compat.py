"""Each accessor of ``fae_torchrec.torchrec_compat`` against the installed TorchRec, for real: it fails,
naming the private name, when TorchRec (or PyTorch) renames one or changes what it means.

Planner accessors run on a CPU topology; pipeline accessors and ``ShardedTensor`` on a tiny model under
``DistributedModelParallel`` on one gloo rank.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
import torch.distributed as dist
import torchrec
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import Enumerator, ParameterConstraints, ShardingOption, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import (
    PrefetchTrainPipelineSparseDist,
    TrainPipelineSparseDist,
    train_pipelines,
)
from torchrec.distributed.train_pipeline.pipeline_context import (
    PrefetchTrainPipelineContext,
    TrainPipelineContext,
)
from torchrec.distributed.types import ShardedModule
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec import torchrec_compat as compat
from tests.distributed import run_on_ranks

CPU = torch.device("cpu")
TABLES = [
    EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=50, feature_names=[f"f{i}"])
    for i in range(2)
]
TABLE_WISE = {
    config.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
    for config in TABLES
}


def _private(owner: object, name: str, why: str) -> str:
    """The message of a failed check: which private name changed, how, and where to adapt to it."""
    owner = getattr(owner, "__qualname__", owner)
    return f"TorchRec changed {owner}.{name}: {why}; update fae_torchrec/torchrec_compat.py"


def test_optimizer_multiplier():
    """``shard_estimators._get_optimizer_multipler``: optimizer state per weight, as TorchRec counts it."""
    shape = torch.Size([100, 8])
    expected = {
        None: 0,
        torch.optim.SGD: 0,
        torchrec.optim.SGD: 0,
        torch.optim.Adam: 2,
        torchrec.optim.RowWiseAdagrad: 1 / 8,
        torch.optim.Adagrad: 1,
    }
    got = {optimizer: compat.optimizer_multiplier(optimizer, shape) for optimizer in expected}
    assert got == expected, _private("shard_estimators", "_get_optimizer_multipler", f"now {got}")


class _Traced(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if compat.is_fx_symbolic_tracing() else x - 1


def test_is_fx_symbolic_tracing():
    """``torch.fx._symbolic_trace.is_fx_symbolic_tracing``: true while torch.fx traces, false otherwise."""
    x = torch.zeros(2)
    assert not compat.is_fx_symbolic_tracing() and torch.equal(_Traced()(x), x - 1)
    traced = torch.fx.symbolic_trace(_Traced())
    assert torch.equal(traced(x), x + 1), _private(
        "torch.fx._symbolic_trace", "is_fx_symbolic_tracing", "false during symbolic tracing"
    )


def test_planner_internals():
    """``EmbeddingShardingPlanner._best_plan``, ``._topology`` and ``._enumerator``: the last plan's
    sharding options (one per table, with storage and perf estimates), the topology and the enumerator."""
    topology = Topology(world_size=1, compute_device="cpu")
    enumerator = EmbeddingEnumerator(topology, 8)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=8, enumerator=enumerator, stats=[])
    assert compat.planner_topology(planner) is topology, _private(
        EmbeddingShardingPlanner, "_topology", "not the topology"
    )
    assert compat.planner_enumerator(planner) is enumerator, _private(
        EmbeddingShardingPlanner, "_enumerator", "not the enumerator"
    )
    assert isinstance(compat.planner_enumerator(EmbeddingShardingPlanner(topology, 8)), Enumerator)
    assert compat.best_plan(planner) is None
    plan = planner.plan(EmbeddingBagCollection(TABLES, device=torch.device("meta")), get_default_sharders())
    options = compat.best_plan(planner)
    assert isinstance(options, list) and all(isinstance(o, ShardingOption) for o in options), _private(
        EmbeddingShardingPlanner, "_best_plan", f"not a list of ShardingOption after plan: {options!r}"
    )
    assert sorted(o.name for o in options) == ["t0", "t1"]
    assert {o.name: o.sharding_type for o in options} == {
        name: sharding.sharding_type for name, sharding in plan.plan[""].items()
    }, _private(EmbeddingShardingPlanner, "_best_plan", "not the options of the plan returned")
    assert all(shard.perf is not None and shard.storage is not None for o in options for shard in o.shards)


class _RecordingFilters(compat.EnumeratorFilterHooks, EmbeddingEnumerator):
    """Records what TorchRec's filters kept, and keeps the first of each only."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, list[str], list[str]]] = []

    def kept_sharding_types(self, kept: list[str], allowed: list[str]) -> list[str]:
        self.calls.append(("sharding", list(kept), list(allowed)))
        return kept[:1]

    def kept_compute_kernels(self, kept: list[str], allowed: list[str]) -> list[str]:
        self.calls.append(("kernel", list(kept), list(allowed)))
        return kept[:1]


def test_enumerator_filter_hooks():
    """``EmbeddingEnumerator._filter_sharding_types`` and ``._filter_compute_kernels``: ``enumerate``
    filters each table's sharding types and kernels through them, and enumerates what they return."""
    for name, ours in (
        ("_filter_sharding_types", ["self", "name", "allowed_sharding_types", "sharder_key"]),
        ("_filter_compute_kernels", ["self", "name", "allowed_compute_kernels", "sharding_type"]),
    ):
        theirs = list(inspect.signature(getattr(EmbeddingEnumerator, name, None) or (lambda: 0)).parameters)
        assert theirs == ours, _private(EmbeddingEnumerator, name, f"its parameters are now {theirs}")
    for hook in ("kept_sharding_types", "kept_compute_kernels"):
        assert not hasattr(EmbeddingEnumerator, hook), f"TorchRec now has a {hook} that the hook would shadow"
    enumerator = _RecordingFilters(Topology(world_size=1, compute_device="cpu"), 8)
    options = enumerator.enumerate(
        EmbeddingBagCollection(TABLES, device=torch.device("meta")), get_default_sharders()
    )
    kinds = {kind for kind, _, _ in enumerator.calls}
    assert kinds == {"sharding", "kernel"}, _private(
        EmbeddingEnumerator, "_filter_*", f"enumerate called {kinds}"
    )
    assert all(kept and set(kept) <= set(allowed) for _, kept, allowed in enumerator.calls)
    first = {kind: {kept[0] for k, kept, _ in enumerator.calls if k == kind} for kind in kinds}
    assert options and {o.sharding_type for o in options} <= first["sharding"], _private(
        EmbeddingEnumerator, "_filter_sharding_types", "enumerate ignores what it returns"
    )
    assert {o.compute_kernel for o in options} <= first["kernel"], _private(
        EmbeddingEnumerator, "_filter_compute_kernels", "enumerate ignores what it returns"
    )


class _Tiny(nn.Module):
    """Two tables and a linear layer on their pooled rows; ``forward(batch)`` returns ``(loss, logits)``."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(TABLES)
        self.top = nn.Linear(4 * len(TABLES), 1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.top(self.ebc(batch.sparse_features).values()).squeeze(-1)
        return nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits.detach()


def _batches(count: int, size: int = 8) -> list[Batch]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        lengths = torch.randint(1, 3, (len(TABLES) * size,), generator=generator)
        ids = torch.randint(0, 50, (int(lengths.sum()),), generator=generator)
        features = KeyedJaggedTensor.from_lengths_sync([c.feature_names[0] for c in TABLES], ids, lengths)
        labels = torch.randint(0, 2, (size,), generator=generator).float()
        batches.append(Batch(torch.zeros(size, 1), features, labels))
    return batches


def _tiny_dmp() -> tuple[DistributedModelParallel, torch.optim.Optimizer]:
    """The tiny model, tables table-wise with a fused SGD, under DMP (in a process group)."""
    torch.manual_seed(0)
    model = _Tiny()
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.1})
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(), compute_device="cpu"),
        batch_size=8,
        constraints=TABLE_WISE,
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=CPU, plan=plan, sharders=sharders)
    dense = [param for _, param in in_backward_optimizer_filter(dmp.named_parameters())]
    return dmp, torch.optim.SGD(dense, lr=0.1)


def _finish(pipeline: TrainPipelineSparseDist) -> None:
    """Wait for what the pipeline left in flight (gloo work left at exit aborts the process)."""
    for context in compat.queued_contexts(pipeline):
        pipeline.wait_sparse_data_dist(context)
        for request in context.input_dist_tensors_requests.values():
            request.wait()
    pipeline.detach()


def _check_sharded_tensor(rank: int, world_size: int) -> None:
    dmp, _ = _tiny_dmp()
    weights = {key: value for key, value in dmp.state_dict().items() if "embedding_bags" in key}
    assert len(weights) == len(TABLES), list(dmp.state_dict())
    for key, weight in weights.items():
        assert isinstance(weight, compat.ShardedTensor), (
            f"torch.distributed._shard.sharded_tensor.ShardedTensor is no longer the class of DMP's sharded "
            f"state ({key}: {type(weight)}); update fae_torchrec/torchrec_compat.py"
        )
        (shard,) = weight.local_shards()
        assert list(shard.metadata.shard_offsets) == [0, 0] and tuple(shard.tensor.shape) == (50, 4)


def test_sharded_tensor(tmp_path):
    """``torch.distributed._shard.sharded_tensor.ShardedTensor``: the class of DMP's sharded state entries,
    whose local shards carry ``.tensor`` and ``.metadata.shard_offsets``."""
    run_on_ranks(_check_sharded_tensor, 1, tmp_path)


def _check_pipelined_modules(rank: int, world_size: int) -> None:
    dmp, optimizer = _tiny_dmp()
    pipeline = TrainPipelineSparseDist(dmp, optimizer, CPU)
    batches = _batches(3)
    assert not compat.is_pipelined(dmp.module.ebc)
    pipeline.progress(iter(batches[:2]))
    modules = compat.pipelined_modules(pipeline)
    sharded = dmp.module.ebc
    assert compat.is_pipelined(sharded), _private(
        TrainPipelineSparseDist, "runtime_forwards.BaseForward", "a pipelined module's forward is not one"
    )
    assert isinstance(sharded, ShardedModule)
    assert [id(module) for module in modules] == [id(sharded)], _private(
        TrainPipelineSparseDist, "_pipelined_modules", f"not the sharded modules: {modules!r}"
    )
    assert pipeline.enqueue_batch(iter(batches[2:]))
    batch, context = compat.queued_batches(pipeline)[-1], compat.queued_contexts(pipeline)[-1]
    compat.set_pipelined_modules(pipeline, [])
    pipeline.start_sparse_data_dist(batch, context)
    assert not context.input_dist_splits_requests and not context.fused_splits_awaitables, _private(
        TrainPipelineSparseDist, "_pipelined_modules", "start_sparse_data_dist starts modules not in it"
    )
    compat.set_pipelined_modules(pipeline, modules)
    assert compat.pipelined_modules(pipeline) is modules
    pipeline.start_sparse_data_dist(batch, context)
    assert context.input_dist_splits_requests or context.fused_splits_awaitables, _private(
        TrainPipelineSparseDist, "_pipelined_modules", "start_sparse_data_dist does not start its modules"
    )
    _finish(pipeline)


def test_pipelined_modules(tmp_path):
    """``TrainPipelineSparseDist._pipelined_modules``: the sharded modules the pipeline's stages start
    (set after the first batch), and only those; ``runtime_forwards.BaseForward``: their forwards then."""
    run_on_ranks(_check_pipelined_modules, 1, tmp_path)


def _check_queues(rank: int, world_size: int) -> None:
    dmp, optimizer = _tiny_dmp()
    pipeline = TrainPipelineSparseDist(dmp, optimizer, CPU)
    batches = _batches(3)
    queued, contexts = compat.queued_batches(pipeline), compat.queued_contexts(pipeline)
    assert len(queued) == len(contexts) == 0
    pipeline.progress(iter(batches[:2]))  # reads both, trains the first
    why = "not the batches read and not yet trained, the next first"
    assert compat.queued_batches(pipeline) is queued and compat.queued_contexts(pipeline) is contexts
    assert len(queued) == len(contexts) == 1, _private(TrainPipelineSparseDist, "batches/contexts", why)
    assert isinstance(contexts[0], TrainPipelineContext) and contexts[0].index == 1, _private(
        TrainPipelineSparseDist, "contexts", f"{contexts[0]!r} is not the context of the second batch"
    )
    assert isinstance(queued[0], Batch) and torch.equal(queued[0].labels, batches[1].labels), _private(
        TrainPipelineSparseDist, "batches", why
    )
    assert pipeline.enqueue_batch(iter(batches[2:])) and len(queued) == len(contexts) == 2
    assert contexts[1].index > contexts[0].index and torch.equal(queued[1].labels, batches[2].labels)
    pipeline.start_sparse_data_dist(queued[1], contexts[1])
    _finish(pipeline)


def test_queued_batches_and_contexts(tmp_path):
    """``TrainPipelineSparseDist.batches`` and ``.contexts``: the batches read and not yet trained, the
    next first, and their contexts (``index`` growing with each batch read)."""
    run_on_ranks(_check_queues, 1, tmp_path)


class _RecordingPrefetch(compat.PrefetchHook, PrefetchTrainPipelineSparseDist):
    """Records the index of each batch TorchRec prefetches, then prefetches it as TorchRec does."""

    def prefetch_hook(self, context) -> None:
        self.__dict__.setdefault("prefetched", []).append(context.index)
        super().prefetch_hook(context)


def _check_prefetch(rank: int, world_size: int) -> None:
    # TorchRec's prefetch of a batch's modules; on a CPU it returns at once (no streams), so a spy records
    # what ``_prefetch`` gives it: the batch's context and the pipelined modules
    prefetched: list[tuple[int, list[int]]] = []
    prefetch_embeddings = train_pipelines.prefetch_embeddings

    def spy(context, modules, *args, **kwargs):
        prefetched.append((context.index, [id(module) for module in modules]))
        return prefetch_embeddings(context, modules, *args, **kwargs)

    train_pipelines.prefetch_embeddings = spy
    dmp, optimizer = _tiny_dmp()
    pipeline = _RecordingPrefetch(dmp, optimizer, CPU)
    pipeline.fill_pipeline(iter(_batches(2)))
    why = "fill_pipeline no longer prefetches the first batch through it"
    assert pipeline.__dict__.get("prefetched") == [0], _private(
        PrefetchTrainPipelineSparseDist, "_prefetch", why
    )
    contexts = compat.queued_contexts(pipeline)
    assert all(isinstance(context, PrefetchTrainPipelineContext) for context in contexts)
    sharded = [id(dmp.module.ebc)]
    assert prefetched == [(0, sharded)], _private(
        PrefetchTrainPipelineSparseDist,
        "_prefetch",
        f"it no longer prefetches the pipelined modules: {prefetched}",
    )
    compat.set_pipelined_modules(pipeline, [])
    compat.stock_prefetch(pipeline, contexts[0])
    compat.set_pipelined_modules(pipeline, [dmp.module.ebc])
    assert prefetched[-1] == (0, []), _private(
        PrefetchTrainPipelineSparseDist, "_prefetch", "it prefetches modules that are not pipelined"
    )
    _finish(pipeline)  # its progress needs CUDA: a forward takes what a prefetch on a stream left


def test_stock_prefetch_and_prefetch_hook(tmp_path):
    """``PrefetchTrainPipelineSparseDist._prefetch(context)``: ``fill_pipeline`` and ``progress`` prefetch
    each batch through it, and it prefetches the pipelined modules; the batch's context has the fields
    FAE's pipeline keeps across a prefetch (``module_input_post_prefetch`` and
    ``module_contexts_post_prefetch``). ``progress`` runs on CUDA only: its call is read from its source."""
    assert not hasattr(PrefetchTrainPipelineSparseDist, "prefetch_hook"), "TorchRec now has a prefetch_hook"
    prefetch = getattr(PrefetchTrainPipelineSparseDist, "_prefetch", None) or (lambda: 0)
    theirs = list(inspect.signature(prefetch).parameters)
    assert theirs == ["self", "context"], _private(
        PrefetchTrainPipelineSparseDist, "_prefetch", f"its parameters are now {theirs}"
    )
    progress = inspect.getsource(PrefetchTrainPipelineSparseDist.progress)
    assert "self._prefetch(" in progress, _private(
        PrefetchTrainPipelineSparseDist, "_prefetch", "progress no longer calls it"
    )
    fields = {field.name for field in dataclasses.fields(PrefetchTrainPipelineContext)}
    assert {"module_input_post_prefetch", "module_contexts_post_prefetch"} <= fields, _private(
        PrefetchTrainPipelineContext, "module_*_post_prefetch", f"fields are now {sorted(fields)}"
    )
    run_on_ranks(_check_prefetch, 1, tmp_path)
