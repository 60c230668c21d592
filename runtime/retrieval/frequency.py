"""How often each item appears in a batch: the sampling probability behind the logQ correction.

In-batch negatives are drawn with the items' popularity, so a softmax over
them punishes popular items too much; Yi et al. ("Sampling-Bias-Corrected
Neural Modeling for Large Corpus Item Recommendations", RecSys 2019) subtract
log Q(item) from each logit, Q being the item's expected number of
appearances in a batch. Two estimates of log Q for a batch's positives:

- `StreamingFrequency`: the paper's streaming estimate (its Algorithm 2).
  Each item hashes to a slot holding the step it was last seen (A) and a
  moving average of the steps between sightings (B):
  B <- (1 - alpha) B + alpha (t - A); A <- t. Q = 1 / B. An item's first
  sighting sets B to the steps since the start (t), not alpha * t, so a new
  item does not look alpha^-1 times more frequent than it is. Updated with
  the global batch's ids, every rank holds the same state; it is a module
  with buffers, so checkpoints carry it.
- `counts_log_q`: from item counts given up front (e.g. counted over the
  training data): Q = batch_size * count / total. An item counted zero times
  is taken as counted once, so its correction stays finite.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["StreamingFrequency", "counts_log_q"]


class StreamingFrequency(nn.Module):
    """The streaming estimate of log Q over `slots` hash slots (ids modulo `slots`)."""

    def __init__(self, slots: int, alpha: float) -> None:
        super().__init__()
        if slots < 1:
            raise ValueError(f"streaming frequency: slots must be at least 1 (got {slots})")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"streaming frequency: alpha must be in (0, 1] (got {alpha})")
        self.slots = slots
        self.alpha = alpha
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.register_buffer("last_seen", torch.zeros(slots, dtype=torch.long))
        self.register_buffer("interval", torch.zeros(slots, dtype=torch.float64))

    @torch.no_grad()
    def update(self, ids: torch.Tensor) -> None:
        """A new step whose batch holds `ids` (an id seen twice counts once: both write the same)."""
        self.step += 1
        slot = ids.reshape(-1).to(self.last_seen.device) % self.slots
        seen = self.last_seen[slot] > 0
        elapsed = (self.step - self.last_seen[slot]).to(torch.float64)
        average = (1 - self.alpha) * self.interval[slot] + self.alpha * elapsed
        self.interval[slot] = torch.where(seen, average, elapsed)
        self.last_seen[slot] = self.step

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        """log Q = -log(steps between sightings) of `ids`, float32; items never seen get log Q = 0."""
        interval = self.interval[ids.reshape(-1).to(self.interval.device) % self.slots]
        return (-torch.log(interval.clamp(min=1.0))).to(torch.float32).reshape(ids.shape).to(ids.device)


def counts_log_q(counts: torch.Tensor, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """log(batch_size * count / total) of `ids` for per-item `counts` [num_items]; float32."""
    total = float(counts.sum())
    chosen = counts.to(ids.device)[ids].to(torch.float64).clamp(min=1.0)
    return torch.log(batch_size * chosen / total).to(torch.float32)
