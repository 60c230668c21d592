"""Embedding tables as TorchRec describes them: `EmbeddingBagConfig`, `EmbeddingConfig`, and the
`EmbeddingOptimizer` fused into their backward. Frozen and torch-free.

A generated module builds its tables' configs here; the collections
(runtime.embeddings) and the sharded lookups take them. TorchRec's users
import them from `runtime` or `runtime.embeddings` as from `torchrec`, and
those names stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OPTIMIZER_TYPES = ("sgd", "adagrad", "rowwise_adagrad", "adam")


@dataclass(frozen=True, slots=True)
class EmbeddingOptimizer:
    """A sparse optimizer applied in backward to the rows of a batch.

    `type` is one of `OPTIMIZER_TYPES`. `eps` defaults to fbgemm's 1e-8
    (torch.optim.Adagrad uses 1e-10). `beta1`, `beta2` and `weight_decay`
    are Adam's; fbgemm's CPU kernels do not apply weight decay for the other
    optimizers, so a non-zero `weight_decay` is only accepted for Adam.
    `embedding_l2` is a loss term, not the optimizer's: (l2 / 2) * ||w_r||^2 for each
    distinct row r a training step looks up, with every optimizer
    (runtime/embeddings/l2_penalty.py).
    """

    type: str = "rowwise_adagrad"
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    embedding_l2: float = 0.0

    def __post_init__(self) -> None:
        if self.type not in OPTIMIZER_TYPES:
            raise ValueError(
                f"unknown embedding optimizer {self.type!r}; expected one of "
                + ", ".join(repr(t) for t in OPTIMIZER_TYPES)
            )
        if self.lr < 0 or self.eps < 0:
            raise ValueError(f"embedding optimizer {self.type!r}: lr and eps must be >= 0")
        if not self.embedding_l2 >= 0:
            raise ValueError(f"embedding optimizer {self.type!r}: embedding_l2 must be >= 0, not {self.embedding_l2}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"embedding optimizer {self.type!r}: beta1 and beta2 must be in [0, 1)")
        if self.weight_decay != 0 and self.type != "adam":
            raise ValueError(f"embedding optimizer {self.type!r}: weight_decay is only supported for 'adam'")


POOLING_TYPES = ("sum", "mean")


@dataclass(frozen=True, slots=True)
class EmbeddingBagConfig:
    """One embedding table and the features that look it up.

    Rows are initialised U(weight_init_min, weight_init_max), by default
    U(-sqrt(1/num_embeddings), +sqrt(1/num_embeddings)) as in TorchRec.
    `optimizer` overrides the collection's optimizer for this table. `where`
    is the spec location the table was compiled from, named in errors.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"
    weight_init_min: float | None = None
    weight_init_max: float | None = None
    optimizer: EmbeddingOptimizer | None = None
    where: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        where = self.describe()
        if self.num_embeddings < 1 or self.embedding_dim < 1:
            raise ValueError(f"{where}: num_embeddings and embedding_dim must be >= 1")
        if not self.feature_names:
            raise ValueError(f"{where}: needs at least one feature name")
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"{where}: unknown pooling {self.pooling!r}; expected 'sum' or 'mean'")
        low, high = self.init_range()
        if not low <= high:
            raise ValueError(f"{where}: weight_init_min {low} is greater than weight_init_max {high}")

    def describe(self) -> str:
        """`table 'cat_3'`, with its spec location when known."""
        return f"table {self.name!r}" + (f" ({self.where})" if self.where else "")

    def init_range(self) -> tuple[float, float]:
        """The (min, max) of the uniform initialisation."""
        bound = math.sqrt(1.0 / self.num_embeddings)
        low = -bound if self.weight_init_min is None else self.weight_init_min
        high = bound if self.weight_init_max is None else self.weight_init_max
        return low, high


@dataclass(frozen=True, slots=True)
class EmbeddingConfig:
    """One embedding table read as sequences by the features that look it up.

    Initialisation and `optimizer` as for `EmbeddingBagConfig`:
    U(-sqrt(1/num_embeddings), +sqrt(1/num_embeddings)) unless given.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    weight_init_min: float | None = None
    weight_init_max: float | None = None
    optimizer: EmbeddingOptimizer | None = None
    where: str = ""  # the spec location it was built from, named in errors

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        if not self.feature_names:
            raise ValueError(f"table {self.name!r}: needs at least one feature name")
        self.lookup_slot()  # validates the rest, with the bag config's messages

    def lookup_slot(self) -> EmbeddingBagConfig:
        """This table as the bag kernels take it: one slot, named after the table, one id per bag."""
        return EmbeddingBagConfig(
            self.name,
            self.num_embeddings,
            self.embedding_dim,
            (self.name,),
            weight_init_min=self.weight_init_min,
            weight_init_max=self.weight_init_max,
            optimizer=self.optimizer,
            where=self.where,
        )

    def describe(self) -> str:
        """`table 'items'`, with its spec location when known."""
        return self.lookup_slot().describe()

    def init_range(self) -> tuple[float, float]:
        """The (min, max) of the uniform initialisation."""
        return self.lookup_slot().init_range()
