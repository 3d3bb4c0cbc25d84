"""What one run of the training recipe does, as one typed object: ``RecipeConfig``, every option of the
examples' command line under its ``argparse`` name (``--batch-size`` is ``batch_size``).

The command line parses into it (``options.parse_args``); a trainer of its own builds it with
``options.recipe_config(family, **options)``, which takes the command's defaults for the family and
checks each option as the command does. The recipe reads nothing else: the values it derives from the
device or a plan file (the pipeline, the copies ahead, a plan's budget) go into a new config that the
built run carries (``Training.config``), never back into the one given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, TypeVar

from fae_torchrec.command_line import Baseline, ColdTier, Order, Pipeline

if TYPE_CHECKING:  # the config is made before torch is imported (--help, bad options)
    from fae_torchrec.train.replan import ReplanPolicy


T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """One run of the recipe: the data, the model and its plan, the steps, the optimizers, the outputs.
    The options of one model family only (DLRM's ``num_samples``, TBSM's ``num_users``) are None for the
    other. ``--help`` says what each does; docs/train.md how a trainer calls the recipe with one."""

    # the data (DLRM: Criteo's layout or a schema's; TBSM: Taobao's)
    data: Sequence[str]
    seed: int
    tables: str | None
    scale: float | None
    num_samples: int | None = None
    schema: str | None = None
    ids_per_feature: int | None = None
    label_gap: float | None = None
    days: int | None = None
    drift: float | None = None
    criteo_scale: float | None = None
    val_every: int | None = None
    num_users: int | None = None
    ts_length: int | None = None
    points_per_user: int | None = None
    test_share: float | None = None
    synthetic_scale: float | None = None
    # what is trained and how it is planned
    baseline: Baseline | None
    hbm_cap: str | None
    dim: int
    batch_size: int
    epochs: int
    sample: float
    exclude_profiled: bool
    budget: str
    stats: str | None
    plan: str | None
    # steps and where cold rows live
    order: Order
    order_seed: int | None
    balance: float
    warmup: float
    pipeline: Pipeline | None
    cold_tier: ColdTier
    copy_ahead: int | None
    # optimizers, evaluation and re-planning
    optimizer: str
    lr: float
    dense_lr: float
    eval_every: int
    replan: ReplanPolicy
    replan_window: int
    # outputs, checkpoints and traces
    out: str
    compare: str | None
    checkpoint_dir: str | None
    checkpoint_every: int
    resume: bool
    trace_steps: int

    def options(self, names: Sequence[str]) -> dict:
        """The values of the options ``names``, by name."""
        return {name: getattr(self, name) for name in names}

    @property
    def chosen_pipeline(self) -> Pipeline:
        """``pipeline`` as the built run has it (``Training.config``: its device's default filled in)."""
        if self.pipeline is None:
            raise ValueError("--pipeline: not chosen yet; build_training chooses it for the device")
        return self.pipeline

    @property
    def chosen_copy_ahead(self) -> int:
        """``copy_ahead`` as the built run with a planned cold tier has it (its device's default filled
        in)."""
        if self.copy_ahead is None:
            raise ValueError("--copy-ahead: not chosen yet; build_training chooses it for the device")
        return self.copy_ahead


def required(value: T | None, option: str) -> T:
    """``value`` of ``option``, which the run needs (a config of another model family has none)."""
    if value is None:
        raise ValueError(f"{option}: needs a value here")
    return value


#: Every option's name, in the order the config declares them.
OPTION_NAMES = tuple(field.name for field in fields(RecipeConfig))
