"""A retrieval head's sampled softmax as the runtime reads it: frozen, torch-free.

A generated module builds one `SampledSoftmaxConfig` for its sampled_softmax
head; runtime.retrieval.sampled_softmax's loss module draws its negatives and
keeps its frequency state from it.
"""

from __future__ import annotations

from dataclasses import dataclass

NEGATIVES = ("in_batch", "uniform", "both")
FREQUENCIES = ("streaming", "counts")


@dataclass(frozen=True, slots=True)
class SampledSoftmaxConfig:
    """A retrieval head's softmax.

    `negatives`: in_batch, uniform or both. `num_negatives`: uniform samples a
    step, drawn from ids [first_id, num_items) with generator key (seed,
    step). `logq`: subtract log Q; `frequency`: its in-batch estimate,
    `streaming` (over `frequency_slots` hash slots, moving-average weight
    `frequency_alpha`) or `counts` (item counts handed to the loss).
    `per_query`: each query draws its own `num_negatives` uniform ids.
    """

    negatives: str = "in_batch"
    num_negatives: int = 0
    num_items: int = 0
    first_id: int = 0
    temperature: float = 1.0
    normalize: bool = False
    logq: bool = False
    frequency: str = "streaming"
    frequency_slots: int = 1 << 20
    frequency_alpha: float = 0.05
    seed: int = 0
    per_query: bool = False

    def __post_init__(self) -> None:
        if self.negatives not in NEGATIVES:
            raise ValueError(f"sampled softmax: negatives {self.negatives!r} is not one of {', '.join(NEGATIVES)}")
        if self.frequency not in FREQUENCIES:
            raise ValueError(f"sampled softmax: frequency {self.frequency!r} is not one of {', '.join(FREQUENCIES)}")
        if self.temperature <= 0:
            raise ValueError(f"sampled softmax: temperature must be > 0 (got {self.temperature})")
        if self.uniform:
            if self.num_negatives < 1:
                raise ValueError(
                    f"sampled softmax: negatives {self.negatives!r} needs num_negatives >= 1 (got {self.num_negatives})"
                )
            if self.num_items <= self.first_id:
                raise ValueError(
                    f"sampled softmax: uniform negatives need num_items > first_id "
                    f"(got num_items {self.num_items}, first_id {self.first_id})"
                )

        if self.per_query and not self.uniform:
            raise ValueError(f"sampled softmax: per_query draws uniform negatives, but negatives is {self.negatives!r}")

    @property
    def in_batch(self) -> bool:
        return self.negatives in ("in_batch", "both")

    @property
    def uniform(self) -> bool:
        return self.negatives in ("uniform", "both")
