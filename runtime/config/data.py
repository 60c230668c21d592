"""A model's inputs as the data readers and the trainer read them: typed, frozen, runtime-owned.

A generated module builds one `ModelInputs` (its INPUTS constant) from the
resolved spec, as it builds its tables' `EmbeddingBagConfig`s and its HEADS:
the dense and sparse features, the heads, the `training:` defaults and the
`data:` section. The readers, the synthetic data and the worker take it
instead of the spec's dict form. `where` is the spec location a value was
compiled from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.config.heads import HeadConfig
from runtime.config.training import TrainingConfig
from runtime.config.transforms import DenseTransform, SparseTransform


@dataclass(frozen=True, slots=True)
class DenseFeatureConfig:
    """A float vector of `size` columns; `transform` fills, clips, logs and scales them (runtime.features.numeric),
    or makes its one column from the earlier rows of a key (runtime.features.aggregate)."""

    name: str
    size: int
    where: str = ""
    transform: DenseTransform | None = None


@dataclass(frozen=True, slots=True)
class SparseFeatureConfig:
    """A bag of ids looked up in `table` (of `num_embeddings` rows).

    A sample holds exactly `ids_per_sample` ids when `fixed_ids`, else 0 to
    `ids_per_sample`; `weighted` features carry one weight per id. A sequence
    feature has a `max_length` (ids in time order, most recent last); the
    model cuts longer ones to their `keep` side ("end" or "start").

    A feature with a `column` reads that column instead of its own: another
    sparse feature's ids (the readers fan them out), or, with `boundaries`,
    column `column_index` of a dense feature, bucketized (see
    runtime.data.feature_columns).
    """

    name: str
    table: str
    num_embeddings: int
    ids_per_sample: int = 1
    fixed_ids: bool = True
    weighted: bool = False
    where: str = ""
    max_length: int | None = None
    keep: str = "end"
    column: str | None = None
    column_index: int = 0
    boundaries: tuple[float, ...] = ()
    transform: SparseTransform | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "boundaries", tuple(float(b) for b in self.boundaries))


@dataclass(frozen=True, slots=True)
class TimestampsConfig:
    """Per-position times (int64, e.g. unix seconds) of the sequence feature `sequence`.

    In a batch it is a key of the sparse KeyedJaggedTensor, named `name`,
    with the sequence's lengths: one time per id.
    """

    name: str
    sequence: str
    where: str = ""


@dataclass(frozen=True, slots=True)
class DataConfig:
    """The spec's `data:` section: a reader, the path it reads, and column -> feature or label."""

    reader: str
    path: str | None = None
    columns: tuple[tuple[str, str], ...] = ()
    where: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple((str(c), str(t)) for c, t in self.columns))


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """Everything outside the model the runtime needs to feed it: features, heads, training, data.

    `learned` is the state of the features' learned transforms
    (runtime.features.state.LearnedFeatures), set once learned or read
    (`dataclasses.replace(inputs, learned=...)`); a generated module's INPUTS has none.
    """

    dense: tuple[DenseFeatureConfig, ...]
    sparse: tuple[SparseFeatureConfig, ...]
    heads: tuple[HeadConfig, ...]
    training: TrainingConfig
    data: DataConfig | None = None
    device: str = "cpu"
    timestamps: tuple[TimestampsConfig, ...] = ()
    learned: Any = None

    def __post_init__(self) -> None:
        for name in ("dense", "sparse", "heads", "timestamps"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
