"""How the recipe sizes a planned cold tier's slots (``--cold-tier planned``): at least the rows of one step,
and within the device memory the planner gives the tier, where the schedule's copies fall most."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence

from fae_torchrec.data.block import SampleBlock
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

#: The slots of each cold table, given the device memory the planner gives the slot tables (bytes over
#: all devices; None where there is none to fill, on CPU).
SlotSizing = Callable[[float | None], dict[str, int]]


def slot_sizing(
    args: argparse.Namespace,
    partitions: Sequence[HotColdPartition],
    validation: SampleBlock | None,
    hot_set: HotSet,
    world: int,
    warmup: float,
    saved: Mapping[str, int] | None = None,
) -> SlotSizing:
    """How the run sizes the slots of ``hot_set``'s cold tables, training on ``partitions`` (a re-plan's
    rest of its epoch, then every input) and evaluating on ``validation``: at least the most distinct
    cold rows of ``--copy-ahead`` + 1 cold steps in a row of any epoch's schedule (``min_cold_slots``) or
    of one evaluation step
    (``evaluation_cold_slots``); within a budget, grown where the first partition's first epoch's slot
    plans copy fewest rows per byte (``allocate_slots``, rows with their optimizer state). ``saved``: a
    resumed run's slots, kept as they are."""
    if saved:
        return lambda budget: dict(saved)
    routers = [
        BatchRouter(p, args.batch_size, world, order=args.order, seed=order_seed(args), warmup=warmup)
        for p in partitions
    ]
    floors = [
        min_cold_slots(router.partition, router.schedule(epoch), hot_set, args.copy_ahead)
        for router in routers
        for epoch in range(args.epochs)
    ]
    if validation is not None and len(validation):
        keys = partitions[0].keys
        floors.append(evaluation_cold_slots(validation, keys, hot_set, args.batch_size, world))
    floor = {table: max(f[table] for f in floors) for table in floors[0]}

    def sized(budget: float | None) -> dict[str, int]:
        slots = floor if budget is None else _allocated(routers[0], hot_set, floor, budget, args)
        logger.info(
            "planned cold tier: slots per cold table %s (one step's rows: %s; device memory for them: %s)",
            slots, floor, "none on CPU" if budget is None else format_bytes(budget),
        )  # fmt: skip
        return slots

    return sized


def _allocated(
    router: BatchRouter, hot_set: HotSet, floor: dict[str, int], budget: float, args: argparse.Namespace
) -> dict[str, int]:
    """``floor`` grown within ``budget`` bytes over the cold steps of ``router``'s first epoch, copies
    ``--copy-ahead`` steps early."""
    pools = cold_step_pools(router.partition, router.schedule(0), hot_set)
    layout = hot_set.layout
    row_bytes = dict(zip(layout.names, layout.row_bytes(EMBEDDING_OPTIMIZERS[args.optimizer]), strict=True))
    return allocate_slots(pools, row_bytes, budget, floor, ahead=args.copy_ahead)
