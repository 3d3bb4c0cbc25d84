"""How fast a first day's hot set decays on a real time-stamped click log (Taobao's ``UserBehavior.csv``).

Reads the events of one or more ``UserBehavior.csv`` files (``read_user_behavior``: user, item, category,
behaviour, time), cuts them into days (Beijing time, the log's own), profiles a random half of the first
day with at least ``--min-events`` events (``AccessProfiler`` over the item and category of each event),
takes FAE's hot set of ``--budget`` rows of both tables together (the most accessed rows), and prints
for every day the share of its events (the other half of the profiled day, every event of the later ones)
whose item and category are both hot (FAE's entirely-hot input for a per-event model), and each feature's
share alone. The log is not stored here (its terms forbid redistribution):
``../shared/realdata/taobao_userbehavior_tail10k/PROVENANCE.md`` says where a 9-day slice of 114 users'
complete histories is published::

    python benchmarks/bench_decay.py UserBehavior.csv           # 10,000 events: a second

Writes ``bench_decay.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.arguments import fail
from fae_torchrec import AccessProfiler
from fae_torchrec.arguments import positive_int
from fae_torchrec.data.taobao_csv import read_user_behavior

#: Seconds a day, and the log's time zone (Beijing, UTC+8) in seconds.
DAY, BEIJING = 86_400, 8 * 3600
FEATURES = ("item", "category")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="UserBehavior.csv files (user,item,category,behavior,time)")
    parser.add_argument("--budget", type=positive_int, default=1000, help="hot rows, both tables together")
    parser.add_argument(
        "--min-events", type=positive_int, default=100, help="events of the first day profiled"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the profiled half")
    parser.add_argument("--out", default="runs/bench_decay", help="bench_decay.json goes here")
    args = parser.parse_args(argv)
    try:
        events = read_user_behavior(args.files)
    except (OSError, ValueError) as error:
        fail(str(error))
    ids = {"item": events.item, "category": events.category}
    sizes = dict(zip(("user", "item", "category"), events.table_sizes, strict=True))
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=sizes[f], embedding_dim=1, feature_names=[f])
        for f in FEATURES
    ]
    day = (events.timestamp + BEIJING) // DAY
    days, counts = np.unique(day, return_counts=True)
    if not (counts >= args.min_events).any():
        fail(f"{' '.join(args.files)}: no day has {args.min_events} events (--min-events)")
    first = days[np.argmax(counts >= args.min_events)]
    profiled = (day == first) & (np.random.default_rng(args.seed).random(len(day)) < 0.5)
    stats = AccessProfiler(tables, 1.0, holdout_size=0).profile([{f: ids[f][profiled] for f in FEATURES}])
    # a row costs 4 bytes at dim 1: the budget in rows
    hot_set = stats.hot_set(4 * args.budget)
    rows = []
    for d in days[days >= first]:
        chosen = (day == d) & ~profiled
        batch = {f: ids[f][chosen] for f in FEATURES}
        alone = {f: float(hot_set.is_hot(f"t_{f}", batch[f]).mean()) for f in FEATURES}
        rows.append(
            {
                "day": int(d - first),
                "events": int(chosen.sum()),
                "hot": float(hot_set.is_hot_input(batch).mean()),
                **alone,
            }
        )
    result = {
        "files": args.files,
        "budget_rows": args.budget,
        "hot_rows": [len(h) for h in hot_set.hot_ids],
        "days": rows,
    }
    half = f"a half of day 0 ({int(profiled.sum())} events)"
    print(f"hot set of {half}: {result['hot_rows']} hot rows (item, category)")
    print("day  events   item and category hot   item hot   category hot")
    for r in rows:
        shares = f"{100 * r['hot']:>20.1f}%  {100 * r['item']:>8.1f}%  {100 * r['category']:>12.1f}%"
        print(f"{r['day']:>3}  {r['events']:>6}   {shares}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_decay.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
