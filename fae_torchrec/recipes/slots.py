"""How the recipe sizes a planned cold tier's slots (``--cold-tier planned``): at least the rows of one step,
and within the device memory the planner gives the tier, where the schedule's copies fall most; and what
each slot table then copies per cold step, which the planner prices."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fae_torchrec.data.block import SampleBlock
from fae_torchrec.recipes.config import RecipeConfig
from fae_torchrec.recipes.options import order_seed
from fae_torchrec.stats.hot_set import HotSet
from fae_torchrec.train.cold_tier import cold_step_pools, min_cold_slots
from fae_torchrec.train.evaluation import evaluation_cold_slots
from fae_torchrec.train.optimizers import EMBEDDING_OPTIMIZERS
from fae_torchrec.train.partition import HotColdPartition
from fae_torchrec.train.router import BatchRouter
from fae_torchrec.train.slot_plan import allocate_slots
from fae_torchrec.units import format_bytes

logger = logging.getLogger("fae_torchrec.recipes")


@dataclass(frozen=True)
class SlotLayout:
    """A planned cold tier's slots per cold table, and the bytes each table's slot plan of the first
    epoch copies in and back per cold step (optimizer state with them): ``FAEShardingPlanner.slot_copies``,
    which it prices. A checkpoint's summary keeps both, so that a resumed run plans the same layout."""

    slots: dict[str, int]
    copied_bytes: dict[str, float]


#: The slots of each cold table and their copies, given the device memory the planner gives the slot
#: tables (bytes over all devices; None where there is none to fill, on CPU).
SlotSizing = Callable[[float | None], SlotLayout]


def slot_sizing(
    args: RecipeConfig,
    partitions: Sequence[HotColdPartition],
    validation: SampleBlock | None,
    hot_set: HotSet,
    world: int,
    warmup: float,
    saved: SlotLayout | None = None,
) -> SlotSizing:
    """How the run sizes the slots of ``hot_set``'s cold tables, training on ``partitions`` (a re-plan's
    rest of its epoch, then every input) and evaluating on ``validation``: at least the most distinct
    cold rows of ``--copy-ahead`` + 1 cold steps in a row of any epoch's schedule (``min_cold_slots``) or
    of one evaluation step
    (``evaluation_cold_slots``); within a budget, grown where the first partition's first epoch's slot
    plans copy fewest rows per byte (``allocate_slots``, rows with their optimizer state); with the copies
    of that epoch's plans per cold step (planned as it sized them). ``saved``: a resumed run's, kept as they
    are."""
    if saved is not None:
        return lambda budget: saved
    routers = [
        BatchRouter(p, args.batch_size, world, order=args.order, seed=order_seed(args), warmup=warmup)
        for p in partitions
    ]
    floors = [
        min_cold_slots(router.partition, router.schedule(epoch), hot_set, args.chosen_copy_ahead)
        for router in routers
        for epoch in range(args.epochs)
    ]
    if validation is not None and len(validation):
        keys = partitions[0].keys
        floors.append(evaluation_cold_slots(validation, keys, hot_set, args.batch_size, world))
    floor = {table: max(f[table] for f in floors) for table in floors[0]}

    def sized(budget: float | None) -> SlotLayout:
        # the first epoch's cold steps, read again here rather than held since the floors
        pools = cold_step_pools(routers[0].partition, routers[0].schedule(0), hot_set)
        layout = hot_set.layout
        optimizer = EMBEDDING_OPTIMIZERS[args.optimizer]
        row_bytes = dict(zip(layout.names, layout.row_bytes(optimizer), strict=True))
        # copies ahead: --copy-ahead steps early; no budget (CPU): the floors
        allocation = allocate_slots(pools, row_bytes, budget or 0.0, floor, ahead=args.chosen_copy_ahead)
        slots = allocation.slots
        cold_steps = max(len(bounds) - 1 for _, bounds in pools.values()) if pools else 0
        copied = {
            table: rows * row_bytes[table] / max(cold_steps, 1)
            for table, rows in allocation.copied_rows.items()
        }
        logger.info(
            "planned cold tier: slots per cold table %s (one step's rows: %s; device memory for them: %s); "
            "the first epoch copies %s per cold step",
            slots, floor, "none on CPU" if budget is None else format_bytes(budget),
            format_bytes(sum(copied.values())),
        )  # fmt: skip
        return SlotLayout(slots, copied)

    return sized
