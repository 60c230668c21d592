"""How a model trains, as the spec's `training:` section and optimizer say: frozen, torch-free.

A generated module's INPUTS carries a `TrainingConfig` (steps, batch size,
seed, early stopping, the plateau schedule, precision) and its
DENSE_OPTIMIZER a `DenseOptimizerConfig` (runtime.train.dense_optimizer
builds the torch optimizer from it); its LR_SCHEDULE is
runtime.config.lr_schedule's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlateauConfig:
    """The spec's `training.lr_plateau`: runtime.train.lr_plateau.LrPlateau's parameters, `mode`
    None for the metric's own direction, `where` its spec location."""

    metric: str
    mode: str | None = None
    factor: float = 0.1
    patience: int = 1
    min_factor: float = 0.0
    threshold: float = 1e-4
    where: str = ""


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    """The spec's training defaults: steps, global batch size, seed and early stopping
    (`training.early_stopping`: runtime/train/early_stopping.py); flags override them."""

    steps: int
    batch_size: int
    seed: int
    where: str = ""
    best_metric: str | None = None
    patience: int | None = None
    early_stopping_where: str = ""  # the spec location of `training.early_stopping`
    lr_plateau: PlateauConfig | None = None  # `training.lr_plateau` (runtime/train/lr_plateau.py)
    precision: str = "fp32"  # `training.precision` (runtime.train.precision)
    precision_where: str = ""


DENSE_OPTIMIZER_TYPES = ("sgd", "adagrad", "adam", "adamw")


@dataclass(frozen=True, slots=True)
class DenseOptimizerConfig:
    """An optimizer and its hyper-parameters; `where` is the spec location it was compiled from."""

    type: str
    lr: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    where: str = ""

    def __post_init__(self) -> None:
        if self.type not in DENSE_OPTIMIZER_TYPES:
            at = f" ({self.where})" if self.where else ""
            raise ValueError(f"dense optimizer {self.type!r}{at} is not supported (sgd, adagrad, adam or adamw)")
