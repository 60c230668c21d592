"""Model quality metrics per head, exact over all ranks.

    bce heads      ne (normalised entropy), auc, accuracy; log_loss (the mean
                   binary cross-entropy) when asked for
    mse heads      mse, rmse
    softmax heads  accuracy
    sampled_softmax heads  recall@k, ndcg@k, hit_rate@k, mrr of held-out
                   positives ranked against the whole item table, or at
                   training's log steps against a sample of a large one
                   (runtime.retrieval.head_metrics; the candidates come from
                   the model, `catalogue`: runtime.retrieval.catalogue)

Each head's metrics are the ones its HeadConfig lists (`head.metrics`).
`MetricSet.update` accumulates a rank's outputs and labels; `compute` (a
collective: every rank calls it) combines all ranks and starts a new window.
Sums (cross-entropy, positives, correct predictions, squared errors, counts)
are all-reduced in float64; AUC needs every score, so the scores and labels
of all ranks are gathered and AUC is computed once over the whole set. The
result equals one process's metric on the same samples, not a mean of
per-rank metrics.

NE follows the definition TorchRec and the "Practical Lessons from
Predicting Clicks on Ads at Facebook" paper use: the mean log loss divided
by the entropy of the background click rate, -(p log p + (1 - p) log(1 - p)).
Log loss comes from the logits (softplus), so it is exact for confident
predictions. AUC is the area under the ROC curve with tied scores counted
as half (the Mann-Whitney statistic); it is computed on logits, which rank
samples as probabilities do without sigmoid's rounding ties.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime.config.heads import HeadConfig
from runtime.data.columns import USER_IDS
from runtime.retrieval.catalogue import Catalogue, StepCandidates
from runtime.retrieval.head_metrics import RetrievalHeadMetrics

MetricValues = dict[str, float | None]
DEFAULT_METRICS = {
    "bce": ("ne", "auc", "accuracy"),
    "mse": ("mse", "rmse"),
    "softmax": ("accuracy",),
    "sampled_softmax": ("recall@10", "ndcg@10"),
}


class HeadMetrics:
    """The metric state of one head over the current window."""

    def __init__(self, head: HeadConfig) -> None:
        self.name = head.name
        self.label = head.label
        self.loss = head.loss
        self.probability = head.probability
        self.metrics = head.metrics or DEFAULT_METRICS[self.loss]
        self._keep_scores = "auc" in self.metrics
        self.reset()

    def reset(self) -> None:
        # samples, log-loss sum, positives, and correct predictions or squared errors
        self._sums = torch.zeros(4, dtype=torch.float64)
        self._scores: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def update(self, output: torch.Tensor, label: torch.Tensor) -> None:
        """Add a batch: `output` holds logits (bce: B, softmax: B x C) or values (mse: B)."""
        output = output.detach().to("cpu", torch.float64)
        label = label.detach().to("cpu", torch.float64)
        count = float(label.numel())
        if self.loss == "bce":
            output = output.reshape(-1)
            ce = _log_loss(output, label, self.probability)
            correct = ((output >= (0.5 if self.probability else 0.0)) == (label > 0.5)).sum()
            self._add(count, float(ce.sum()), float(label.sum()), float(correct))
            if self._keep_scores:
                self._scores.append(output)
                self._labels.append(label)
        elif self.loss == "mse":
            self._add(count, 0.0, 0.0, float((output.reshape(-1) - label).pow(2).sum()))
        else:
            self._add(count, 0.0, 0.0, float((output.argmax(dim=1) == label.long()).sum()))

    def _add(self, count: float, loss_sum: float, positives: float, fourth: float) -> None:
        self._sums += torch.tensor([count, loss_sum, positives, fourth], dtype=torch.float64)

    def compute(self, process_group: dist.ProcessGroup | None = None) -> MetricValues:
        """The window's metrics over all ranks (a collective), then a new window."""
        sums = _all_reduce(self._sums, process_group)
        count, loss_sum, positives, fourth = sums.tolist()
        values: MetricValues = {}
        if "auc" in self.metrics:
            scores = _all_gather(_cat(self._scores), process_group)
            labels = _all_gather(_cat(self._labels), process_group)
            values["auc"] = auc(scores, labels)
        for metric in self.metrics:
            if metric == "ne":
                values[metric] = normalized_entropy(loss_sum, positives, count)
            elif metric == "log_loss":
                values[metric] = loss_sum / count if count else None
            elif metric in ("accuracy", "mse"):
                values[metric] = fourth / count if count else None
            elif metric == "rmse":
                values[metric] = math.sqrt(fourth / count) if count else None
        self.reset()
        return {metric: values[metric] for metric in self.metrics}


def _log_loss(output: torch.Tensor, label: torch.Tensor, probability: bool) -> torch.Tensor:
    """Per-sample log loss: from the logit (softplus, stable), or from a probability with each log
    clamped at -100 as the probability head's loss (torch's BCELoss) clamps it."""
    if not probability:
        return F.softplus(output) - label * output
    log_p = torch.log(output).clamp(min=-100.0)
    log_q = torch.log1p(-output).clamp(min=-100.0)
    return -(label * log_p + (1 - label) * log_q)


class MetricSet:
    """The metrics of every head of a spec.

    `catalogue` gives the candidates a retrieval head's positives rank against
    (a collective: the model's item vectors, runtime.retrieval.catalogue; in
    training each step's own candidates, `StepCandidates`, kept with each batch
    and ranked together at the log step: runtime.retrieval.head_metrics); a spec
    with a sampled_softmax head needs it (and has only one such head).
    """

    def __init__(self, heads: Sequence[HeadConfig], catalogue: Catalogue | StepCandidates | None = None) -> None:
        self.heads = [HeadMetrics(head) for head in heads if head.loss != "sampled_softmax"]
        self.retrieval = {
            head.name: RetrievalHeadMetrics(head.metrics or DEFAULT_METRICS[head.loss], head.mask_seen)
            for head in heads
            if head.loss == "sampled_softmax"
        }
        if self.retrieval and catalogue is None:
            names = ", ".join(repr(name) for name in self.retrieval)
            raise ValueError(f"retrieval head {names}: its metrics need the model's item catalogue")
        self.catalogue = catalogue
        self.order = [head.name for head in heads]

    def update(
        self, outputs: Mapping[str, torch.Tensor], labels: Mapping[str, torch.Tensor], real: int | None = None
    ) -> None:
        """Add a batch; only its first `real` samples when given (the rest is padding)."""
        for head in self.heads:
            output, label = outputs[head.name], labels[head.label]
            if real is not None:
                output, label = output[:real], label[:real]
            head.update(output, label)
        step = self.catalogue if isinstance(self.catalogue, StepCandidates) else None
        for name, retrieval in self.retrieval.items():
            retrieval.update(outputs[name], real, labels.get(USER_IDS), step)  # type: ignore[arg-type]

    def compute(self, process_group: dist.ProcessGroup | None = None) -> dict[str, MetricValues]:
        """head name -> metric -> value over all ranks (None when undefined); a collective."""
        values = {head.name: head.compute(process_group) for head in self.heads}
        if self.retrieval:
            assert self.catalogue is not None
            for name, retrieval in self.retrieval.items():
                values[name] = retrieval.compute(self.catalogue, process_group)
        return {name: values[name] for name in self.order}


def agreed(metrics: Mapping[str, MetricValues], process_group: dist.ProcessGroup | None) -> dict[str, MetricValues]:
    """Rank 0's `metrics` on every rank (a collective; `metrics` itself without a group).

    Every rank computes an evaluation's metrics from the same all-reduced sums
    and gathered scores, so they should be equal already; taking rank 0's makes
    it certain whatever a rank's own arithmetic (threads, kernels). The
    decisions taken from an evaluation (early stopping, the plateau's rates)
    are then one decision: no rank ends training while another waits for it
    in its next collective.
    """
    mine = {head: dict(values) for head, values in metrics.items()}
    if process_group is None or not _distributed(process_group):
        return mine
    box: list[object] = [mine]
    dist.broadcast_object_list(box, src=dist.get_global_rank(process_group, 0), group=process_group)
    return cast(dict[str, MetricValues], box[0])


def normalized_entropy(loss_sum: float, positives: float, count: float) -> float | None:
    """Mean log loss over the entropy of the positive rate; None when every label is the same."""
    if count == 0:
        return None
    rate = positives / count
    if rate <= 0.0 or rate >= 1.0:
        return None
    baseline = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return (loss_sum / count) / baseline


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Area under the ROC curve, ties counted as half; None without both classes."""
    order = torch.argsort(scores, descending=True, stable=True)
    ranked, positive = scores[order], (labels[order] > 0.5).double()
    _, ties = torch.unique_consecutive(ranked, return_counts=True)
    ends = ties.cumsum(0) - 1  # the last sample of each group of equal scores
    zero = torch.zeros(1, dtype=torch.float64)
    tp = torch.cat([zero, positive.cumsum(0)[ends]])
    fp = torch.cat([zero, (1 - positive).cumsum(0)[ends]])
    positives, negatives = float(tp[-1]), float(fp[-1])
    if positives == 0 or negatives == 0:
        return None
    area = ((fp[1:] - fp[:-1]) * (tp[1:] + tp[:-1])).sum() / 2
    return float(area) / (positives * negatives)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _device(process_group: dist.ProcessGroup | None) -> torch.device:
    """Where the group's collectives run: the current GPU for NCCL, else the CPU."""
    if process_group is not None and dist.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _distributed(process_group: dist.ProcessGroup | None) -> bool:
    return process_group is not None and dist.get_world_size(process_group) > 1


def _all_reduce(tensor: torch.Tensor, process_group: dist.ProcessGroup | None) -> torch.Tensor:
    if not _distributed(process_group):
        return tensor
    total = tensor.to(_device(process_group), copy=True)
    dist.all_reduce(total, group=process_group)
    return total.cpu()


def _all_gather(tensor: torch.Tensor, process_group: dist.ProcessGroup | None) -> torch.Tensor:
    """Every rank's `tensor` (1-d, lengths may differ), in rank order."""
    if not _distributed(process_group):
        return tensor
    device, world = _device(process_group), dist.get_world_size(process_group)
    size = torch.tensor([tensor.numel()], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=process_group)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=tensor.dtype, device=device)
    padded[: tensor.numel()] = tensor.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=process_group)
    return torch.cat([part[: int(n)] for part, n in zip(gathered, sizes)]).cpu()
