"""Train TBSM (the time-based sequence model) with FAE on DistributedModelParallel, or a baseline.

The same recipe as ``examples/train_dlrm_fae.py``, with the same options and outputs, on TBSM over
Taobao-like user histories: a sample is a user's last ``--ts-length`` events and a target item, each
step looking up the user, item and category tables. An input is hot only when every id of every step
is hot. The profile samples 20% of the inputs by default (FAE's TBSM setting; DLRM: 5%).

    python examples/train_tbsm_fae.py                          # built-in synthetic Taobao-like data
    python examples/train_tbsm_fae.py --baseline               # the same model and data, TorchRec alone
    torchrun --nproc_per_node 2 examples/train_tbsm_fae.py     # 2 ranks
    python examples/train_tbsm_fae.py --data taobao-csv UserBehavior.csv
    fae-torchrec profile --model tbsm --out s.npz && fae-torchrec plan --model tbsm --stats s.npz --out p.pt
    python examples/train_tbsm_fae.py --stats s.npz --plan p.pt   # trains on that plan

Validation takes one window per test user (users whose last event is after the 70th percentile of
last events, as the reference's split).
"""

from fae_torchrec.recipes import TBSM, run

if __name__ == "__main__":
    run(TBSM)
