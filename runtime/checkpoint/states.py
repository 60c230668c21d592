"""The named objects a checkpoint saves beside the model and the dense optimizer.

Anything that offers `state_dict()` and `load_state_dict(state)` (torch's
`Stateful` protocol, as torch.distributed.checkpoint expects) is registered
under a name, in one of two places of a checkpoint (runtime.checkpoint.store):

- shared: one state for the whole run (the learning-rate schedule, early
  stopping, the kernel choices); plain JSON data, rank 0's kept as the
  manifest's entry of that name. Every rank's `state_dict()` is called, in
  registration order, so a state may gather from the ranks (a collective).
- per rank: each rank's own (its RNG states, its data position); pickled under
  `rank.<r>` as {name: state}, and handed back to the same rank at the same
  world size only.

A new kind of state is one more registered object: the store has no parameter
per kind. The manifest and the `rank.<r>` entries are laid out as checkpoints
always were, so the older ones load unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful

__all__ = ["CheckpointStates", "RngState", "Stateful"]

# Saved in every `rank.<r>` entry, None where nothing is registered (the layout checkpoints always had).
RANK_ENTRIES = ("rng", "data")


class CheckpointStates:
    """Stateful objects by name: `shared` ones go to the manifest, `per_rank` ones to `rank.<r>`."""

    def __init__(self) -> None:
        self.shared: dict[str, Stateful] = {}
        self.per_rank: dict[str, Stateful] = {"rng": RngState()}

    def register(self, name: str, state: Stateful, *, per_rank: bool = False) -> None:
        """Save `state` under `name` from now on (replacing one of that name)."""
        (self.per_rank if per_rank else self.shared)[name] = state

    def shared_state(self) -> dict[str, Any]:
        """The manifest's entries: each shared object's state, in registration order."""
        return {name: dict(state.state_dict()) for name, state in self.shared.items()}

    def rank_state(self) -> dict[str, Any]:
        """This rank's `rank.<r>` entry."""
        saved: dict[str, Any] = dict.fromkeys(RANK_ENTRIES)
        saved.update({name: state.state_dict() for name, state in self.per_rank.items()})
        return saved

    def load_shared(self, manifest: Mapping[str, Any]) -> None:
        """Hand each shared object the manifest's entry of its name (an older checkpoint may lack it)."""
        for name, state in self.shared.items():
            if manifest.get(name) is not None:
                state.load_state_dict(manifest[name])

    def load_rank(self, saved: Mapping[str, Any]) -> None:
        """Hand each per-rank object this rank's saved state of its name."""
        for name, state in self.per_rank.items():
            if saved.get(name) is not None:
                state.load_state_dict(saved[name])


class RngState:
    """The process's random generators: torch's CPU (and CUDA, once used) and Python's `random`."""

    def state_dict(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return rng

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
