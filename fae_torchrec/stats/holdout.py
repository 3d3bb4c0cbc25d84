"""The inputs a profile left out of its sample, kept to estimate what the hot set does on unseen data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Holdout:
    """Inputs left out of the sample: their global rows, and for each row the input it belongs to.

    A global row is ``table offset + id``, tables in order, so one array serves all tables. Inputs
    are numbered ``0..num_inputs-1``; one that carries no id has no row but still counts.
    """

    rows: np.ndarray
    owners: np.ndarray
    num_inputs: int

    def __len__(self) -> int:
        return self.num_inputs
