"""The training recipe's command line: its options, the combinations it refuses, and what a resume must
share with the run that saved."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fae_torchrec.arguments import (
    byte_size,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
    share,
    unwritable_directory,
)
from fae_torchrec.command_line import (
    BASELINES,
    COLD_TIERS,
    OPTIMIZER_NAMES,
    ORDERS,
    PIPELINES,
    STREAM_ORDERS,
    Baseline,
    ColdTier,
    HelpFormatter,
    Order,
    Pipeline,
)
from fae_torchrec.recipes.config import RecipeConfig
from fae_torchrec.recipes.curves import compared_run
from fae_torchrec.recipes.family import ModelFamily

if TYPE_CHECKING:  # imported when the options are checked, after --help
    from fae_torchrec.train.replan import ReplanPolicy

logger = logging.getLogger("fae_torchrec.recipes")


#: The options whose values the config holds as their enums.
_ENUMS = {"order": Order, "pipeline": Pipeline, "cold_tier": ColdTier, "baseline": Baseline}


def build_parser(family: ModelFamily) -> argparse.ArgumentParser:
    """The command line of the recipe for ``family``: its data options first, its defaults set."""
    parser = argparse.ArgumentParser(description=family.description, formatter_class=HelpFormatter)
    family.add_arguments(parser)
    _add_planning_options(parser.add_argument_group("what is trained and how it is planned"))
    _add_schedule_options(parser.add_argument_group("steps and where cold rows live"), family)
    _add_training_options(parser.add_argument_group("optimizers, evaluation and re-planning"))
    _add_output_options(parser.add_argument_group("outputs, checkpoints and traces"))
    parser.set_defaults(**family.defaults)  # fae_torchrec.defaults: those of profile and plan too
    return parser


def parse_args(family: ModelFamily, argv: list[str] | None = None) -> RecipeConfig:
    """The run the command line ``argv`` (``sys.argv`` when None) asks of the recipe for ``family``;
    exits with status 2 on a bad option or combination."""
    parser = build_parser(family)
    try:
        return _resolved(family, vars(parser.parse_args(argv)))
    except ValueError as error:
        parser.error(str(error))


def recipe_config(family: ModelFamily, **options: object) -> RecipeConfig:
    """The run of the recipe for ``family`` with ``options`` (by their ``argparse`` names, such as
    ``batch_size=256``, ``data=["criteo-npy", prefix]``, ``replan=["every", "50"]``) and the command's
    defaults for the rest, for a trainer that calls the recipe without a command line. Each option is
    checked and converted as the command line does its text; raises ``ValueError`` naming it."""
    parser = build_parser(family)
    actions = {action.dest: action for action in parser._actions}
    chosen = vars(parser.parse_args([]))
    for name, value in options.items():
        if name not in chosen:
            raise ValueError(
                f"{name}: not an option of {family.name}'s recipe; choose from {', '.join(chosen)}"
            )
        chosen[name] = _checked(actions.get(name), value)
    return _resolved(family, chosen)


def _checked(action: argparse.Action | None, value: object) -> object:
    """``value`` of ``action``'s option, converted by its type and checked against its choices as the
    command line checks its text (a list for an option of several words)."""
    if action is None:
        return value
    flag = action.option_strings[0] if action.option_strings else action.dest
    if value is None:
        if action.default is not None:
            raise ValueError(f"{flag}: needs a value (None is not one; leave it out for the default)")
        return value
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ValueError(f"{flag}: True or False, got {value!r}")
        return value
    words = [value]
    if action.nargs == "+":
        if isinstance(value, str) or not isinstance(value, Iterable) or not (words := list(value)):
            raise ValueError(f"{flag}: a list of one or more words, got {value!r}")
    convert = action.type if callable(action.type) else None
    converted = []
    for word in words:
        try:
            word = word if convert is None else convert(str(word))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
            raise ValueError(f"{flag} {word}: {error}") from error
        if action.choices is not None and word not in action.choices:
            raise ValueError(f"{flag} {word!r}: choose from {', '.join(map(str, action.choices))}")
        converted.append(word)
    return converted if action.nargs == "+" else converted[0]


def _resolved(family: ModelFamily, options: dict) -> RecipeConfig:
    """The config of ``options`` (every option's value, as parsed): ``--warmup``'s default by
    ``--order``, ``--replan``'s words as a policy, the combinations checked. Raises ``ValueError``
    naming the option."""
    for name, kind in _ENUMS.items():
        options[name] = None if options[name] is None else kind(options[name])
    if options["warmup"] is None:
        options["warmup"] = family.warmup if options["order"] in STREAM_ORDERS else 0.0
    if isinstance(options["replan"], list):
        try:
            options["replan"] = replan_policy(options["replan"], options["replan_window"])
        except ValueError as error:
            raise ValueError(f"--replan {' '.join(options['replan'])}: {error}") from error
    config = RecipeConfig(**options)
    if config.compare is not None:
        compared_run(config.compare)  # refused before the run, not after it
    problem = _invalid_combination(config)
    if problem:
        raise ValueError(problem)
    return config


def option_names(family: ModelFamily) -> list[str]:
    """The names of the options of ``family``'s recipe (its own data options, not the other family's)."""
    return list(vars(build_parser(family).parse_args([])))


def _add_planning_options(parser: argparse._ArgumentGroup) -> None:
    """FAE or a baseline, the model's size, the profile and the hot set, the plan."""
    parser.add_argument(
        "--baseline",
        nargs="?",
        const="torchrec",
        choices=BASELINES,
        help="TorchRec alone, data in random order, planned by TorchRec's default planner (torchrec, "
        "the default), with scaled-up UVM caches (scaleup) or all tables in device memory (hbm)",
    )
    parser.add_argument(
        "--hbm-cap",
        type=byte_size,
        help="device memory per GPU the planners may use (FAE, torchrec, scaleup; CUDA only)",
    )
    parser.add_argument("--dim", type=positive_int, help="embedding dimension")
    parser.add_argument("--batch-size", type=positive_int, help="per-rank batch size")
    parser.add_argument("--epochs", type=positive_int, default=1, help="passes over the training inputs")
    parser.add_argument("--sample", type=fraction, help="profiled fraction of inputs")
    parser.add_argument(
        "--exclude-profiled",
        action="store_true",
        help="train (either mode) on the training inputs the profile did not sample only, so that what "
        "the run measures comes from inputs disjoint from those that chose the hot set (benchmarks)",
    )
    parser.add_argument("--budget", type=byte_size, help="hot-row budget (FAE)")
    parser.add_argument(
        "--stats",
        metavar="FILE",
        help="the statistics `fae-torchrec profile` wrote for this data: choose the hot set from them "
        "(--budget, rows with their --optimizer state) instead of profiling again",
    )
    parser.add_argument(
        "--plan",
        metavar="FILE",
        help="FAE: shard with the plan `fae-torchrec plan --out` wrote from --stats instead of planning, "
        "on the hot set it was made for (its budget, not --budget); refused when made for other devices, "
        "world size, tables, --dim, --optimizer, statistics or hot set",
    )


def _add_schedule_options(parser: argparse._ArgumentGroup, family: ModelFamily) -> None:
    """The order of hot and cold steps, the train pipeline, the cold tier."""
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="stream",
        help="hot/cold step order (stream: each input trains where the baseline's random order has it)",
    )
    parser.add_argument(
        "--order-seed",
        type=non_negative_int,
        help="seed of the random step orders, to vary the order alone (default: --seed)",
    )
    parser.add_argument(
        "--balance",
        type=share,
        default=0.0,
        help="the share of the label bias of hot steps taken out: of the hot inputs of the label they "
        "over-represent, as many as would make them click at the data's rate, times this, train in "
        "cold steps (1: hot steps at the data's click rate)",
    )
    parser.add_argument(
        "--warmup",
        type=share,
        help="stream order: the share of the first epoch trained in cold steps only, before any hot step "
        f"(default {family.warmup}; other orders take none)",
    )
    parser.add_argument(
        "--pipeline",
        choices=PIPELINES,
        help="sparse: TorchRec's TrainPipelineSparseDist (FAETrainPipeline for FAE), which overlaps the "
        "next batch's input distribution with the step; prefetch (CUDA only): TorchRec's "
        "PrefetchTrainPipelineSparseDist (FAEPrefetchTrainPipeline), which also fetches the next "
        "batch's cache misses, with every UVM cache planned for it (CacheParams(prefetch_pipeline=True)); "
        "none: a plain loop (default: prefetch on CUDA, sparse on CPU)",
    )
    parser.add_argument(
        "--cold-tier",
        choices=COLD_TIERS,
        default="caching",
        help="FAE: where cold rows live. caching: cold tables planned by FAEShardingPlanner, in FBGEMM's UVM "
        "caches on CUDA (fused_uvm_caching); planned: cold rows in host memory with their optimizer state "
        "and, in device memory, plain fused tables of slots that each cold step's rows are copied into "
        "ahead of it, chosen from the epoch's schedule (Belady: evict the row used farthest ahead); each "
        "table's slots hold a step's rows and, on CUDA, grow within the device memory TorchRec's "
        "estimates leave them where the schedule's copies fall most (docs/train.md)",
    )
    parser.add_argument(
        "--copy-ahead",
        type=non_negative_int,
        help="--cold-tier planned: cold steps before its own that a cold step's rows are copied in, so the "
        "copies overlap the steps between (on CUDA on a side stream); the slots then hold the rows of "
        "that many more steps (default: 1 on CUDA, 0 on CPU, where nothing runs beside the step)",
    )


def _add_training_options(parser: argparse._ArgumentGroup) -> None:
    """The optimizers, evaluations, and watching and re-planning."""
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_NAMES), help="embedding optimizer")
    parser.add_argument("--lr", type=positive_float, default=0.05, help="embedding learning rate")
    parser.add_argument("--dense-lr", type=positive_float, default=0.05, help="dense (Adagrad) learning rate")
    parser.add_argument(
        "--eval-every",
        type=non_negative_int,
        default=0,
        help="steps between evaluations (0: at each epoch's end)",
    )
    parser.add_argument(
        "--replan",
        nargs="+",
        default=["never"],
        metavar="MODE",
        help="FAE: watch the hot-input share while training and re-plan as popularity drifts: never (watch "
        "and report only, the default), auto (when the share has clearly fallen below the plan's and moving "
        "the rows pays), or every N (every N steps, when the recent hot set covers more inputs)",
    )
    parser.add_argument(
        "--replan-window",
        type=positive_int,
        default=100,
        help="steps the measured share spans, between auto's checks, and the recent counts' half-life",
    )


def _add_output_options(parser: argparse._ArgumentGroup) -> None:
    """Where the outputs go, checkpoints and resuming, traces."""
    parser.add_argument("--out", default="runs/train", help="metrics.json and curves.png go here")
    parser.add_argument(
        "--compare",
        metavar="RUN",
        help="another run's metrics.json, or its --out folder (such as a --baseline run's), drawn in grey "
        "in curves.png beside this run's",
    )
    parser.add_argument("--checkpoint-dir", help="write a checkpoint here every --checkpoint-every steps")
    parser.add_argument(
        "--checkpoint-every", type=non_negative_int, default=0, help="steps between checkpoints"
    )
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    parser.add_argument(
        "--trace-steps",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="write a torch.profiler trace of the first N training steps to --out (trace-rankR.json, one per "
        "rank; FAE's stages labelled, docs/trace.md)",
    )


def order_seed(args: RecipeConfig) -> int:
    """The seed of the step orders: ``--order-seed``, else ``--seed``."""
    return args.seed if args.order_seed is None else args.order_seed


def replan_policy(words: list[str], window: int) -> ReplanPolicy:
    """``--replan``'s words as a policy: ``never``, ``auto`` or ``every N``."""
    from fae_torchrec.train.replan import ReplanMode, ReplanPolicy

    if words in (["never"], ["auto"]):
        return ReplanPolicy(ReplanMode(words[0]), every=window, window=window)
    if len(words) == 2 and words[0] == "every" and words[1].isdigit() and int(words[1]) > 0:
        return ReplanPolicy(ReplanMode.EVERY, every=int(words[1]), window=window)
    raise ValueError("expected never, auto or every N (N a positive number of steps)")


def _invalid_combination(args: RecipeConfig) -> str | None:
    """What is wrong with options that are fine one by one (output directories that cannot be written,
    ``--resume`` without a checkpoint), or None."""
    if args.resume and not args.checkpoint_dir:
        return "--resume needs --checkpoint-dir"
    if args.plan and not args.stats:
        return "--plan needs --stats, the statistics file the plan was made from"
    if args.plan and args.baseline:
        return "--plan: a plan of FAE's split tables; a --baseline plans its unsplit tables itself"
    if args.cold_tier == ColdTier.PLANNED:
        refused = (
            ("--baseline", args.baseline, "TorchRec's unsplit tables have no cold part"),
            ("--plan", args.plan, "a plan file holds caches for the cold part, not slots; let the run plan"),
            ("--pipeline prefetch", args.pipeline == Pipeline.PREFETCH, "there is no cache to prefetch into"),
        )
        for option, given, why in refused:
            if given:
                return f"--cold-tier planned with {option}: {why}"
    elif args.copy_ahead is not None:
        return "--copy-ahead: only with --cold-tier planned (FBGEMM's caches fetch their own rows)"
    if args.stats and args.exclude_profiled:
        return "--exclude-profiled: which inputs --stats sampled is not in the statistics file; profile here"
    from fae_torchrec.train.schedule import check_warmup

    try:
        check_warmup(args.warmup, args.order)
    except ValueError as error:
        return f"--warmup {args.warmup}: {error}"
    for option, directory in (("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir)):
        if directory is None:
            continue
        problem = unwritable_directory(directory)
        if problem is not None:
            return f"{option} {directory}: {problem}"
    if args.checkpoint_dir and not args.checkpoint_every and not args.resume:
        return "--checkpoint-dir needs --checkpoint-every N (steps between checkpoints)"
    return None


def check_resume_position(args: RecipeConfig, epoch: int, step: int, epoch_steps: int) -> None:
    """Log that a run resumed at its last step has nothing left to train (it evaluates and writes its
    metrics); raise ``ValueError`` naming ``--epochs`` when the checkpoint lies beyond the run's end."""
    if epoch >= args.epochs:
        raise ValueError(
            f"--epochs {args.epochs}: the checkpoint in --checkpoint-dir {args.checkpoint_dir} is at epoch "
            f"{epoch}, step {step}, past the last epoch of this run; resume with --epochs {epoch + 1} or more"
        )
    if epoch == args.epochs - 1 and step == epoch_steps:
        logger.info("nothing left to train: the checkpoint is at the last step of epoch %d", epoch)


def resume_config(args: RecipeConfig, family: ModelFamily) -> dict:
    """The options a resumed run must share with the run that saved, keyed as written on the command
    line (every option but these: how long to train, how often to evaluate and save, where to write,
    what to trace)."""
    free = {
        "epochs",
        "eval_every",
        "out",
        "checkpoint_dir",
        "checkpoint_every",
        "resume",
        "compare",
        "trace_steps",
    }
    # its own options, and the defaults computed from other options, named
    chosen = {**args.options(option_names(family)), **family.named_defaults(args)}
    chosen["replan"] = repr(args.replan)
    return {f"--{key.replace('_', '-')}": value for key, value in chosen.items() if key not in free}
