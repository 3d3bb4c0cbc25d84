"""The labels FAE's stages carry in a ``torch.profiler`` trace, named as TorchRec's train pipeline names its
own (``## forward ##``, ``## sparse_data_dist ##``), so that a trace of an FAE run shows where FAE's own
work goes beside TorchRec's (docs/trace.md)."""

#: ``prepare_data``: the offline pass (profile, hot set, partition), on every rank.
PREPARE = "## fae_prepare_data ##"
#: The router reading a step's inputs from the partition and splitting them for the parts.
ROUTE = "## fae_route ##"
#: ``FAEEmbeddingBagCollection.split``: a batch's ids into the hot and the cold part's inputs.
SPLIT = "## fae_split ##"
#: ``FAEEmbeddingBagCollection.forward`` of a hot step (the hot part only) and of a cold step (both).
HOT_FORWARD, COLD_FORWARD = "## fae_hot_forward ##", "## fae_cold_forward ##"
#: One training step as the recipe runs it (the plain loop's step, or a pipeline's ``progress``).
STEP = "## fae_step ##"
#: A planned cold tier routing a cold step's ids to its slots and copying rows in.
COLD_TIER = "## fae_cold_tier ##"
#: A re-plan's watching of a trained step (recent access counts, in a thread of its own).
WATCH = "## fae_watch ##"
#: A re-plan's check (the decision), and its move of the rows to the new hot set.
REPLAN_CHECK, REPLAN_MOVE = "## fae_replan_check ##", "## fae_replan_move ##"
#: Every label, for a reader of traces.
LABELS = (PREPARE, ROUTE, SPLIT, HOT_FORWARD, COLD_FORWARD, STEP, COLD_TIER, WATCH, REPLAN_CHECK, REPLAN_MOVE)
