"""Quiet commands: the TorchRec, FBGEMM and PyTorch notices checked harmless for what FAE runs are kept off
the terminal while a command (the CLI, the training recipe) runs; every other record and warning shows."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

#: (logger, message start) of the log records checked harmless; FAE's planner repeats them on every run
#: of TorchRec's planner, once or more per budget it tries.
CHECKED_RECORDS: tuple[tuple[str, str], ...] = (
    # data-parallel tables are plain replicated tensors: there is no cache for the caching params to set
    ("torchrec.distributed.utils", "Sharding Type is data_parallel, caching params will be ignored"),
    # TorchRec's plan check (on the root logger): its plans give data-parallel tables no sharding spec
    ("root", "Sharding spec not found for "),
    # the dry-run dense-size caveat of the HeuristicalStorageReservation FAE's planner keeps on purpose
    (
        "torchrec.distributed.planner.storage_reservations",
        "There is a known issue with TorchRec's dense tensor size calculation in dry run scenarios",
    ),
    # the scale-up proposer keeps one option a table; FAE plans it as one candidate among plans (TorchRec's
    # default proposers, FAE's own cache sizes) that price the others, and the scale-up baseline is it alone
    ("torchrec.distributed.planner.proposers", "EmbeddingOffloadScaleupProposer - ignored "),
    # KeyedJaggedTensor's constructor asks torch.fx whether it is tracing; nothing FAE runs traces
    (
        "torch.fx._symbolic_trace",
        "is_fx_tracing will return true for both fx.symbolic_trace and torch.export",
    ),
)

#: (category, message start, module regex) of the warnings checked harmless.
CHECKED_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # TorchRec's notice about the storage reservation FAE's planner keeps on purpose
    (FutureWarning, "HeuristicalStorageReservation is known to cause issues", ""),
    # TorchRec's own DDP wrappers pass DDP's renamed argument, which still means what it did
    (FutureWarning, "`broadcast_buffers` is deprecated", r"torchrec\."),
    # torch's notice on ShardedTensor, which DMP's state dicts still are in TorchRec 1.8 (FAE reads and
    # writes shards through them: re-plans, checkpoints); nothing to move to before TorchRec moves
    (FutureWarning, "Please use DTensor instead and we are deprecating ShardedTensor", ""),
    # FBGEMM's CPU lookup for data-parallel tables: its gradients are nn.EmbeddingBag's (checked by hand)
    (
        UserWarning,
        "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered",
        "",
    ),
)


class _CheckedRecords(logging.Filter):
    """Drops the records in ``CHECKED_RECORDS``: set on the loggers they are logged on."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(record.name == name and message.startswith(start) for name, start in CHECKED_RECORDS)


@contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """The logger ``name`` at ``level`` inside the block, at its own level again after it."""
    named = logging.getLogger(name)
    before = named.level
    named.setLevel(level)
    try:
        yield
    finally:
        named.setLevel(before)


@contextmanager
def torchrec_quiet() -> Iterator[None]:
    """Inside the block, the log records in ``CHECKED_RECORDS`` and the warnings in ``CHECKED_WARNINGS``
    are dropped; FAE's own records and every other record or warning show as before.

    What keeps the commands' and examples' consoles readable: TorchRec repeats these notices on every
    run of its planner (FAE's knob runs it once or more per budget it tries) and on every sharded model.
    Wrap a script's planning, sharding and training in it (docs/setup.md, "A quiet console"); outside
    the block nothing is filtered, so a test or another library still sees every warning."""
    checked = _CheckedRecords()
    loggers = [logging.getLogger(name) for name in dict.fromkeys(name for name, _ in CHECKED_RECORDS)]
    for named in loggers:
        named.addFilter(checked)
    try:
        with warnings.catch_warnings():
            for category, start, module in CHECKED_WARNINGS:
                warnings.filterwarnings("ignore", re.escape(start), category, module)
            yield
    finally:
        for named in loggers:
            named.removeFilter(checked)
