"""Stage 2, the split module: an ``EmbeddingBagCollection`` split into hot and cold parts
(``fae_embedding_bag``), a batch's features split for its parts before the step (``SplitFeatures``),
and full state dicts in and out of its DMP shards (``state``). ``planner/`` places the parts."""

from fae_torchrec.modules.fae_embedding_bag import FAEEmbeddingBagCollection, part_table_name
from fae_torchrec.modules.split_features import SplitFeatures
from fae_torchrec.modules.state import gather_full_state_dict, load_full_state_dict, load_initial_tables

__all__ = [
    "FAEEmbeddingBagCollection",
    "SplitFeatures",
    "gather_full_state_dict",
    "load_full_state_dict",
    "load_initial_tables",
    "part_table_name",
]
