"""Stage 1, which rows are hot: profile a sample of the inputs, rank rows, choose the hot set, and
estimate how many inputs it makes entirely hot.

``profiler`` counts accesses (``AccessProfiler``) into ``access_stats`` (``AccessStats``, with the
``holdout`` of unseen inputs); ``recent`` keeps counting, decayed and bounded, while training
(``RecentAccessCounts``); ``ranking`` is FAE's rule (``RowRanking``); ``hot_set`` the chosen rows
(``HotSet``); ``hot_share`` the share of inputs they make entirely hot; ``feature_ids`` reads the ids
of a batch; ``plots`` draws a profile.
"""

from fae_torchrec.stats.access_stats import AccessStats
from fae_torchrec.stats.feature_ids import FeatureIds
from fae_torchrec.stats.holdout import Holdout
from fae_torchrec.stats.hot_set import COLD, HOT, PARTS, HotSet
from fae_torchrec.stats.hot_share import (
    ShareCurve,
    ShareEstimate,
    estimate_hot_share,
    hot_share_curve,
    measure_hot_share,
)
from fae_torchrec.stats.profiler import AccessProfiler
from fae_torchrec.stats.ranking import RowRanking
from fae_torchrec.stats.recent import RecentAccessCounts

__all__ = [
    "COLD",
    "HOT",
    "PARTS",
    "AccessProfiler",
    "AccessStats",
    "FeatureIds",
    "Holdout",
    "HotSet",
    "RecentAccessCounts",
    "RowRanking",
    "ShareCurve",
    "ShareEstimate",
    "estimate_hot_share",
    "hot_share_curve",
    "measure_hot_share",
]
