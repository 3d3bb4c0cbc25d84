"""Per-feature id arrays of one batch as numpy views: the common input of profiling and classification."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TypeAlias

import numpy as np
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from fae_torchrec.tables import TableLayout


@dataclass(frozen=True)
class FeatureIds:
    """Ids of ``stride`` inputs: per feature a flat ``values`` array and per-input ``lengths``."""

    stride: int
    values: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]

    @classmethod
    def of(cls, data: BatchLike) -> FeatureIds:
        """Views of a TorchRec ``Batch``, a ``KeyedJaggedTensor``, or input-aligned id arrays.

        Id arrays map a feature name to an array of shape ``(n,)`` (one id per input) or ``(n, m)``
        (``m`` ids per input); all features must have the same ``n``. ``FeatureIds`` come back as they are.
        """
        if isinstance(data, FeatureIds):
            return data
        if isinstance(data, Batch):
            data = data.sparse_features
        if isinstance(data, KeyedJaggedTensor):
            return cls._of_kjt(data)
        return cls._of_arrays(data)

    @classmethod
    def _of_kjt(cls, kjt: KeyedJaggedTensor) -> FeatureIds:
        stride = kjt.stride()
        values = kjt.values().numpy()
        lengths = kjt.lengths().numpy()
        offsets = np.concatenate([[0], np.cumsum(kjt.length_per_key())])
        return cls(
            stride=stride,
            values={k: values[offsets[i] : offsets[i + 1]] for i, k in enumerate(kjt.keys())},
            lengths={k: lengths[i * stride : (i + 1) * stride] for i, k in enumerate(kjt.keys())},
        )

    @classmethod
    def _of_arrays(cls, arrays: Mapping[str, np.ndarray]) -> FeatureIds:
        if not arrays:
            raise ValueError("no features given")
        shapes = {k: np.shape(v) for k, v in arrays.items()}
        strides = {s[0] if s else None for s in shapes.values()}
        if len(strides) != 1 or any(len(s) not in (1, 2) for s in shapes.values()):
            raise ValueError(f"id arrays must be (n,) or (n, m) with one n, got shapes {shapes}")
        stride = next(iter(shapes.values()))[0]
        values, lengths = {}, {}
        for key, ids in arrays.items():
            ids = np.asarray(ids)
            if not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"feature {key}: ids must be integers, got {ids.dtype}")
            per_input = 1 if ids.ndim == 1 else ids.shape[1]
            values[key] = ids.reshape(-1)
            lengths[key] = np.full(stride, per_input, dtype=np.int64)
        return cls(stride=stride, values=values, lengths=lengths)

    def single_hot(self, key: str) -> bool:
        """True when every input carries exactly one id of ``key``."""
        return self._single_hot[key]

    @cached_property
    def _single_hot(self) -> dict[str, bool]:
        return {
            key: len(values) == self.stride and bool(np.all(self.lengths[key] == 1))
            for key, values in self.values.items()
        }

    def input_index(self, key: str) -> np.ndarray:
        """For each id of ``key``, the index of the input that carries it."""
        if self.single_hot(key):
            return np.arange(self.stride)
        return np.repeat(np.arange(self.stride), self.lengths[key])

    def subset(self, inputs: np.ndarray) -> FeatureIds:
        """The ids of the inputs where the boolean mask ``inputs`` is True, in input order."""
        index = np.flatnonzero(inputs)
        values, lengths = {}, {}
        for key, ids in self.values.items():
            if self.single_hot(key):
                values[key] = ids[index]
                lengths[key] = np.ones(len(index), dtype=self.lengths[key].dtype)
            else:
                values[key] = ids[np.repeat(inputs, self.lengths[key])]
                lengths[key] = self.lengths[key][index]
        return FeatureIds(stride=len(index), values=values, lengths=lengths)

    def check(self, layout: TableLayout) -> None:
        """Raise unless the features are exactly the layout's and every id is a row of its table."""
        missing = sorted(set(layout.features) - set(self.values))
        extra = sorted(set(self.values) - set(layout.features))
        if missing or extra:
            raise ValueError(f"batch features do not match the tables: missing {missing}, unknown {extra}")
        for key, ids in self.values.items():
            layout.check_ids(layout.table_of(key), ids, feature=key)


#: What the statistics read ids from: a TorchRec ``Batch``, a ``KeyedJaggedTensor``, id arrays by
#: feature, or ``FeatureIds``.
BatchLike: TypeAlias = Batch | KeyedJaggedTensor | Mapping[str, np.ndarray] | FeatureIds
