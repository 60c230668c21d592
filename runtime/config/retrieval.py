"""A retrieval head's sampled softmax as the runtime reads it: frozen, torch-free.

A generated module builds one `SampledSoftmaxConfig` for its sampled_softmax
head; runtime.retrieval.sampled_softmax's loss module draws its negatives and
keeps its frequency state from it.
"""

from __future__ import annotations

from dataclasses import dataclass

FREQUENCIES = ("streaming", "counts")


@dataclass(frozen=True, slots=True)
class Negatives:
    """The candidates each query's positive competes with (the spec's `negatives:`): at least one kind.

    `in_batch`: the other positives of the global batch. `uniform`: this many
    ids drawn uniformly from the item table each step, shared by every query
    and every rank (0: none); with `per_query`, this many for each query.
    """

    in_batch: bool = True
    uniform: int = 0
    per_query: bool = False

    def __post_init__(self) -> None:
        if self.uniform < 0:
            raise ValueError(f"sampled softmax: uniform negatives must be >= 0 (got {self.uniform})")
        if not self.in_batch and not self.uniform:
            raise ValueError("sampled softmax: no negatives (in_batch is off and uniform is 0)")
        if self.per_query and not self.uniform:
            raise ValueError("sampled softmax: per_query draws uniform negatives, but uniform is 0")


@dataclass(frozen=True, slots=True)
class SampledSoftmaxConfig:
    """A retrieval head's softmax.

    `negatives`: in-batch, uniform or both (`Negatives`); uniform ids are drawn
    from [first_id, num_items) with generator key (seed, step). `logq`:
    subtract log Q; `frequency`: its in-batch estimate, `streaming` (over
    `frequency_slots` hash slots, moving-average weight `frequency_alpha`)
    or `counts` (item counts handed to the loss).
    """

    negatives: Negatives = Negatives()
    num_items: int = 0
    first_id: int = 0
    temperature: float = 1.0
    normalize: bool = False
    logq: bool = False
    frequency: str = "streaming"
    frequency_slots: int = 1 << 20
    frequency_alpha: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.frequency not in FREQUENCIES:
            raise ValueError(f"sampled softmax: frequency {self.frequency!r} is not one of {', '.join(FREQUENCIES)}")
        if self.temperature <= 0:
            raise ValueError(f"sampled softmax: temperature must be > 0 (got {self.temperature})")
        if self.negatives.uniform and self.num_items <= self.first_id:
            raise ValueError(
                f"sampled softmax: uniform negatives need num_items > first_id "
                f"(got num_items {self.num_items}, first_id {self.first_id})"
            )


@dataclass(frozen=True, slots=True)
class NextBehaviourConfig:
    """DIEN's auxiliary next-behaviour loss of one `gru` block (its `aux_loss:`), as the runtime reads it.

    `weight` scales the term added to the training loss; each position's
    negative is an id drawn uniformly from [0, num_items) of the history's
    table, per position (runtime.retrieval.sampling.per_query_negatives with
    the step's seed); `max_length` is the history's, the loss's denominator.
    """

    weight: float
    num_items: int
    max_length: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"next-behaviour loss: weight must be > 0 (got {self.weight}); 0 builds no loss")
        if self.num_items < 1:
            raise ValueError(f"next-behaviour loss: num_items must be >= 1 (got {self.num_items})")
        if self.max_length < 2:
            raise ValueError(f"next-behaviour loss: max_length must be >= 2 (got {self.max_length})")
