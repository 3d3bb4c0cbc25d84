"""The training recipe as an API: a trainer builds a ``RecipeConfig`` (``recipe_config``) and trains it
without a command line; each option is checked as the command line checks its text, and the run is the
one the command line would train."""

import dataclasses
import json
import re

import pytest

from fae_torchrec.command_line import Baseline, ColdTier, Order, Pipeline
from fae_torchrec.recipes import DLRM, TBSM, main, parse_args, recipe_config, train
from fae_torchrec.recipes.config import OPTION_NAMES
from fae_torchrec.recipes.options import option_names
from fae_torchrec.train.replan import ReplanMode

#: Tiny synthetic data: 3,600 training inputs, small tables, small batches, a small hot set.
DATA = {"num_samples": 4000, "scale": 0.001, "batch_size": 64, "budget": "8KiB"}


def test_the_config_holds_every_option_of_both_command_lines_and_their_defaults():
    """Every option of DLRM's and TBSM's command lines is a field (and nothing else is); a config of no
    options is the command line's of none, options given as values are those given as text, and the
    defaults that follow other options (``--warmup`` by ``--order``) follow them alike."""
    assert set(OPTION_NAMES) == set(option_names(DLRM)) | set(option_names(TBSM))
    for family in (DLRM, TBSM):
        assert recipe_config(family) == parse_args(family, [])
    given = recipe_config(DLRM, batch_size="128", budget="1MiB", replan=["every", "50"], data=("synthetic",))
    typed = parse_args(DLRM, ["--batch-size", "128", "--budget", "1MiB", "--replan", "every", "50"])
    assert given == typed and given.batch_size == 128 and given.replan.every == 50
    assert recipe_config(TBSM).warmup == TBSM.warmup > 0
    assert recipe_config(TBSM, order="shuffled").warmup == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.batch_size = 1


def test_modes_are_enums_whether_given_as_text_or_as_values():
    """The steps' order, the pipeline, the cold tier, the baseline and the re-plan mode come out as their
    enums (``StrEnum``: each also equals its name, as JSON and the command line write it)."""
    typed = parse_args(
        DLRM, ["--order", "time", "--pipeline", "none", "--baseline", "hbm", "--replan", "auto"]
    )
    given = recipe_config(DLRM, order=Order.TIME, pipeline="none", baseline="hbm", replan=["auto"])
    assert typed == given
    assert (given.order, given.pipeline, given.baseline) == (Order.TIME, Pipeline.NONE, Baseline.HBM)
    assert given.cold_tier is ColdTier.CACHING and given.replan.mode is ReplanMode.AUTO
    assert given.order == "time" and json.dumps([given.order, given.replan.mode]) == '["time", "auto"]'


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": 0}, "--batch-size 0: "),
        ({"batch_size": 2.5}, "--batch-size 2.5: "),
        ({"order": "backwards"}, "--order 'backwards': choose from"),
        ({"data": "synthetic"}, "--data: a list of one or more words, got 'synthetic'"),
        ({"batch": 64}, "batch: not an option of DLRM's recipe"),
        ({"num_users": 10}, "num_users: not an option of DLRM's recipe"),
        ({"resume": "yes"}, "--resume: True or False, got 'yes'"),
        ({"dim": None}, "--dim: needs a value"),
        ({"replan": ["every", "x"]}, "--replan every x: expected never, auto or every N"),
        ({"resume": True}, "--resume needs --checkpoint-dir"),
    ],
)
def test_a_config_option_is_refused_as_its_command_line_option_would_be(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        recipe_config(DLRM, **options)


def test_the_dlrm_recipe_trains_from_a_config_object_alone(tmp_path):
    """``train(DLRM, recipe_config(...))`` trains hot and cold steps and writes its outputs, as the
    command line of the same options does, step for step; the config given is left as it was (the
    device's choices go into the run's own copy)."""
    config = recipe_config(DLRM, **DATA, out=str(tmp_path / "api"))
    metrics = train(DLRM, config)
    assert metrics["hot_steps"] > 0 and metrics["cold_steps"] > 0
    assert 0.5 < metrics["final_auc"] <= 1.0 and len(metrics["history"]["loss"]) > 1
    assert config.pipeline is None and config == recipe_config(DLRM, **DATA, out=str(tmp_path / "api"))
    written = json.loads((tmp_path / "api" / "metrics.json").read_text())
    assert written["final_auc"] == metrics["final_auc"]
    argv = [f"--{name.replace('_', '-')}={value}" for name, value in DATA.items()]
    command = main(DLRM, [*argv, "--out", str(tmp_path / "cli")])
    assert command["history"]["loss"] == metrics["history"]["loss"]
    assert command["final_auc"] == metrics["final_auc"]
