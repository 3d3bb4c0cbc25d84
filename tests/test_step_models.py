"""bench_traffic's step models on points made by hand: what each model charges each plan, the terms
they leave out, and FAE against TorchRec's best."""

from dataclasses import asdict

import pytest

from benchmarks.common.step_models import (
    PCIE,
    FAEFigures,
    Point,
    Terms,
    break_even,
    copy_ahead_step,
    deciding_term,
    decision,
    dlrm_training_flops,
    pipelined_step,
    tier_step,
    torchrec_best,
    transfer_bound,
)

#: The plans whose traffic is replayed: FAE's, and TorchRec's configurations by name ("pp": planned for
#: the prefetch pipeline).
MOVERS = ("FAE pp", "FAE", "FAE hot", "a", "b LRU", "b LRU pp", "b LFU")
MS_PER_BYTE_PER_INPUT = 1e3 * 1000 / PCIE["Gen4"]  # ms a step moving 1 byte per input takes over Gen4


def _point(**changes) -> Point:
    """One GPU, a global batch of 1000; every plan's layout 1 ms in HBM, (c) 1 ms; the link moves
    ``link`` bytes per input of every plan."""
    fields = {
        "dim": 16,
        "world_size": 1,
        "hbm_cap": 1 << 30,
        "num_inputs": 10_000,
        "global_batch": 1000,
        "fae": {
            "FAE pp": FAEFigures(0, 0.0, 0.0, 0.0, 1.0),
            "FAE": FAEFigures(1 << 20, 0.5, 0.6, 0.8, 1.0),
            "FAE hot": FAEFigures(1 << 20, 0.5, 0.6, 0.8, 1.0),
        },
        "traffic": dict.fromkeys(MOVERS, 2.0),
        "link": dict.fromkeys(MOVERS, 1.0),
        "step": {"FAE pp": 1.2, "FAE": 1.5, "FAE hot": 1.3, "a": 3.0, "b LRU": 2.0, "b LRU pp": 1.1}
        | {"b LFU": 2.0, "c": 1.0},
        "in_hbm": dict.fromkeys(("a", "b LRU", "b LRU pp", "b LFU"), 1.0),
        "caches": {"FAE pp": 2, "FAE": 2, "FAE hot": 2, "a": 1, "b LRU": 2, "b LRU pp": 2, "b LFU": 2},
    }
    return Point(**(fields | changes))


def test_the_traffic_model_adds_transfers_or_overlaps_them_with_the_prefetch_pipeline():
    transfer = 1.0 * MS_PER_BYTE_PER_INPUT  # 1 byte per input, 1000 inputs a step: 0.0317 ms
    steps = _point().steps("Gen4")
    assert steps["a"] == pytest.approx(1.0 + transfer) and steps["b LRU"] == pytest.approx(1.0 + transfer)
    assert steps["b LRU pp"] == pytest.approx(1.0), "the transfer hides behind the step"
    assert steps["c"] == 1.0
    # FAE's cold steps (40% of the steps, the measured share) carry all of its traffic
    assert steps["FAE"] == pytest.approx(0.6 * 0.8 + 0.4 * (1.0 + transfer / 0.4))
    big = _point(link=dict.fromkeys(MOVERS, 1e5)).steps("Gen4")  # 3.17 ms of transfers a step
    assert big["b LRU pp"] == pytest.approx(1e5 * MS_PER_BYTE_PER_INPUT), "the transfer exceeds the step"
    # no hot steps: every step is cold and waits for its transfer (the first step's compute aside)
    assert big["FAE pp"] == pytest.approx(1e5 * MS_PER_BYTE_PER_INPUT, rel=1e-3)
    assert _point().steps("perf") == _point().step | {"FAE la": 1.3}, "look-ahead: FAE hot's prediction"


def test_left_out_terms_are_charged_where_they_are_paid():
    point, machinery, dense = _point(), 0.01, 0.5
    plain = point.steps("perf")
    charged = point.steps("perf", Terms(machinery_ms=machinery, dense_ms=dense))
    assert charged["c"] == plain["c"] + dense, "no cache in HBM"
    assert charged["a"] == pytest.approx(plain["a"] + dense + machinery * 1)
    assert charged["b LRU pp"] == pytest.approx(plain["b LRU pp"] + dense + machinery * 2)
    # FAE's hot steps run no cache: the knob's estimated share (50%) of the steps pay none
    assert charged["FAE"] == pytest.approx(plain["FAE"] + dense + machinery * 2 * 0.5)
    slow = point.steps("Gen4", Terms(bandwidth_share=0.1))
    assert slow["a"] == pytest.approx(1.0 + 10 * MS_PER_BYTE_PER_INPUT)


def test_fae_against_torchrecs_best():
    point = _point()
    perf = point.steps("perf")
    assert torchrec_best(perf) == 1.1  # b LRU pp
    assert [decision(r) for r in (1.03, 1.02, 0.99, 0.97)] == ["win", "level", "level", "lose"]
    assert decision(torchrec_best(perf) / perf["FAE pp"]) == "lose"
    # FAE's layout is shorter than the best's (0.9 against 1.0 ms), its cache pricing dearer
    assert deciding_term(point, "FAE", "perf") == "offload"
    assert deciding_term(_point(step=point.step | {"FAE": 0.95}), "FAE", "perf") == "layout"


def test_break_even_finds_the_machinery_cost_at_which_fae_wins_by_a_target():
    """FAE (perf 1.5 ms, 2 caches on half its steps) against b LRU pp (1.1 ms, 2 caches every step):
    best / FAE = (1.1 + 2m) / (1.5 + m) reaches 1.1 at m = 0.55 / 0.9 ms, and 2.5 at no m up to 1 ms."""
    point = _point()
    (found,) = break_even([point], "FAE", "perf", 1.1, Terms(), top=1.0)
    assert found == pytest.approx(0.55 / 0.9, abs=0.001)
    assert break_even([point], "FAE", "perf", 2.5, Terms(), top=1.0) == [None]


def test_dlrm_dense_flops_of_the_reference_configurations():
    # MLPerf's DLRM: bottom 13-512-256-128, 27 vectors' 351 dot products of 128, top 479-1024-1024-512-256-1
    macs = (
        13 * 512 + 512 * 256 + 256 * 128 + 351 * 128 + 479 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256
    )
    assert dlrm_training_flops(128) == 3 * 2 * macs
    assert dlrm_training_flops(16) < dlrm_training_flops(128) / 4


def test_a_point_reads_back_as_it_was_written():
    point = _point()
    assert Point.from_dict(asdict(point)) == point


def test_look_ahead_hides_a_cold_steps_transfer_behind_the_hot_steps_before_it():
    """Half the steps hot, each 1 ms, and a cold step's transfer of 3 ms (1.5 ms a step on average):
    one step ahead a cold step waits for about 2 ms of its transfer, with look-ahead the hot steps
    since the last cold one hide more of it; neither beats the link (1.5 ms a step on average)."""
    one_step = pipelined_step(0.5, 1.0, 1.0, 3.0, lookahead=False)
    ahead = pipelined_step(0.5, 1.0, 1.0, 3.0, lookahead=True)
    assert 1.5 <= ahead < one_step < 0.5 * 1.0 + 0.5 * (1.0 + 3.0)
    assert pipelined_step(0.0, 1.0, 1.0, 0.5, lookahead=True) == pytest.approx(1.0, rel=1e-3), "hidden"
    assert pipelined_step(1.0, 1.0, 2.0, 9.0, lookahead=False) == 1.0, "no cold step"
    # FAE la is FAE hot's plan under the look-ahead pipeline
    point = _point(link=dict.fromkeys(MOVERS, 1e5))
    transfer = 1e5 * MS_PER_BYTE_PER_INPUT / 0.4  # FAE hot's cold steps (40%) carry its traffic
    steps = point.steps("Gen4")
    assert steps["FAE la"] == pytest.approx(pipelined_step(0.6, 0.8, 1.0, transfer, lookahead=True))
    assert steps["FAE hot"] == pytest.approx(pipelined_step(0.6, 0.8, 1.0, transfer, lookahead=False))
    assert steps["FAE la"] < steps["FAE hot"] and point.steps("perf")["FAE la"] == point.step["FAE hot"]


def test_a_point_where_torchrecs_scale_up_planner_finds_no_plan():
    """At many GPUs TorchRec's scale-up caches may not place: the point keeps FAE's plans, (a) and (c),
    and TorchRec's best is (a)."""
    point = _point()
    scaleup = ("b LRU", "b LRU pp", "b LFU")
    kept = {
        name: {plan: value for plan, value in getattr(point, name).items() if plan not in scaleup}
        for name in ("traffic", "link", "step", "in_hbm", "caches")
    }
    partial = _point(**kept)
    assert partial.plans == ("FAE pp", "FAE hot", "FAE la", "FAE", "a", "c")
    for model in ("perf", "Gen4"):
        steps = partial.steps(model)
        assert set(steps) == set(partial.plans) and torchrec_best(steps) == steps["a"]
    assert decision(torchrec_best(partial.steps("perf")) / partial.steps("perf")["FAE"]) == "win"  # 3.0 / 1.5
    assert break_even([partial], "FAE", "perf", 1.1, Terms(), top=1.0) == [0.0]


def test_a_prefetch_hides_only_the_bytes_it_moves():
    """The lookup kernels' own host reads (``direct``: conflict misses, lost hits, ``fused_uvm`` rows)
    stay in a pipelined step; only the prefetched rest overlaps it. Without the pipeline all is in series."""
    transfer = 1e5 * MS_PER_BYTE_PER_INPUT  # 3.17 ms of transfers a step, 1 ms of compute
    point = _point(link=dict.fromkeys(MOVERS, 1e5), direct={"b LRU pp": 4e4, "b LRU": 4e4})
    steps = point.steps("Gen4")
    assert steps["b LRU pp"] == pytest.approx(max(1.0, 0.6 * transfer) + 0.4 * transfer)
    assert steps["b LRU"] == pytest.approx(1.0 + transfer), "in series either way"
    assert _point(link=dict.fromkeys(MOVERS, 1e5)).steps("Gen4")["b LRU pp"] == pytest.approx(transfer)
    # FAE's pipelined cold steps keep their own direct bytes in series too
    hidden = _point(fae={"FAE pp": FAEFigures(1, 0.5, 0.5, 0.5, 1.0)}, link=point.link | {"FAE pp": 1e4})
    both = _point(
        fae={"FAE pp": FAEFigures(1, 0.5, 0.5, 0.5, 1.0)},
        link=point.link | {"FAE pp": 1e4},
        direct={"FAE pp": 1e4},
    )
    assert both.step_of("FAE pp", "Gen4") > hidden.step_of("FAE pp", "Gen4")
    assert both.step_of("FAE pp", "Gen4") == pytest.approx(
        0.5 * 0.5 + 0.5 * (1.0 + 2 * 1e4 * MS_PER_BYTE_PER_INPUT), rel=0.02
    )  # over a random order of 2,048 steps, about half of them hot


def test_fae_wins_only_with_hot_rows():
    """A plan without hot rows is one of TorchRec's configurations, the planner's choice: level where it
    is as fast as TorchRec's best or faster, a loss where slower, never FAE's win."""
    assert [decision(r, hot_rows=False) for r in (1.5, 1.0, 0.97)] == ["level", "level", "lose"]
    assert decision(1.5) == "win"
    point = _point(step=_point().step | {"FAE pp": 0.5})  # FAE pp keeps no hot rows (budget 0)
    assert not point.figures("FAE pp").hot_rows and point.figures("FAE").hot_rows
    assert torchrec_best(point.steps("perf")) / point.steps("perf")["FAE pp"] > 1.02


def test_torchrecs_best_is_the_fastest_configuration_whatever_its_name():
    """TorchRec's plans are the point's configurations (its ``in_hbm`` keys), any names."""
    names = ("default", "default pp tw-all", "scale-up tw-uvm LFU")
    point = _point(
        in_hbm=dict.fromkeys(names, 1.0),
        step=dict(zip(names, (3.0, 0.9, 2.0), strict=True))
        | {k: _point().step[k] for k in ("FAE pp", "FAE", "FAE hot", "c")},
        traffic=dict.fromkeys((*MOVERS[:3], *names), 2.0),
        link=dict.fromkeys((*MOVERS[:3], *names), 1.0),
    )
    assert point.torchrec == names
    assert torchrec_best(point.steps("perf")) == 0.9
    gen4 = point.steps("Gen4")
    assert gen4["default pp tw-all"] == pytest.approx(1.0), "pp in the name: its transfers overlap"
    assert gen4["default"] == pytest.approx(1.0 + MS_PER_BYTE_PER_INPUT)


def test_a_planned_tier_hides_its_copies_behind_the_steps_it_copies_ahead_of():
    """Every step cold, each 1 ms: copies before the step add to it; one cold step ahead they hide
    behind the step before while shorter than it, else the link sets the step; hot steps between cold
    ones hide more, and two steps ahead no less than one."""
    assert copy_ahead_step(0.0, 1.0, 1.0, 0.5, 0) == pytest.approx(1.5)
    assert copy_ahead_step(0.0, 1.0, 1.0, 0.5, 1) == pytest.approx(1.0, rel=1e-3)
    assert copy_ahead_step(0.0, 1.0, 1.0, 3.0, 1) == pytest.approx(3.0, rel=1e-3), "the link's pace"
    before = copy_ahead_step(0.5, 1.0, 1.0, 3.0, 0)
    one, two = (copy_ahead_step(0.5, 1.0, 1.0, 3.0, ahead) for ahead in (1, 2))
    assert before == pytest.approx(0.5 * 1.0 + 0.5 * 4.0, rel=0.02)
    assert 1.5 <= two <= one < before
    assert copy_ahead_step(1.0, 1.0, 2.0, 9.0, 1) == 1.0, "no cold step"


def test_the_tiers_step_is_fae_pp_s_layout_with_its_own_copies_and_host_work():
    """FAE pp's layout (hot step 0.8 ms, cold 1 ms in HBM, 40% cold), its copies (1e5 bytes per input
    on the link: 3.17 ms a step over Gen4) carried by the cold steps; without hot rows every step cold."""
    point = _point(fae=_point().fae | {"FAE pp": FAEFigures(1 << 20, 0.5, 0.6, 0.8, 1.0)})
    transfer = 1e5 * MS_PER_BYTE_PER_INPUT
    step = tier_step(point, 1e5, "Gen4", 0, hot_rows=True)
    assert step == pytest.approx(copy_ahead_step(0.6, 0.8, 1.0, transfer / 0.4, 0))
    assert tier_step(point, 1e5, "Gen4", 0, hot_rows=True, host_ms=0.5) == pytest.approx(
        copy_ahead_step(0.6, 0.8, 1.5, transfer / 0.4, 0)
    )
    assert tier_step(point, 1e5, "Gen4", 1, hot_rows=True) < step
    assert tier_step(point, 1e5, "Gen4", 0, hot_rows=False) == pytest.approx(1.0 + transfer, rel=1e-3)
    halved = tier_step(point, 1e5, "Gen4", 0, hot_rows=False, terms=Terms(bandwidth_share=0.5))
    assert halved == pytest.approx(1.0 + 2 * transfer, rel=1e-3)


def test_a_configuration_is_transfer_bound_where_its_copies_outlast_the_rest_of_its_step():
    small, big = _point(), _point(link=dict.fromkeys(MOVERS, 1e5))  # 3e-5 and 3.17 ms against 1 ms
    assert not transfer_bound(small, "b LRU pp", "Gen4") and transfer_bound(big, "b LRU pp", "Gen4")
    assert not transfer_bound(big, "b LRU pp", "Gen4", Terms(dense_ms=3.0)), "the dense part outlasts it"
    assert transfer_bound(small, "b LRU pp", "Gen4", Terms(bandwidth_share=1e-5))
