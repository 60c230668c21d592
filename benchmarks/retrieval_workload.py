"""Workload "retrieval-bench": a two-tower retrieval model, the single source of truth.

The shape of TorchRec's retrieval example (torchrec/examples/retrieval: a
TwoTower over one EmbeddingBagCollection), trained with a softmax over the
in-batch candidates. Every constant another implementation needs is here,
plus `make_batch`, a numpy-only reference generator (PCG64 `default_rng`,
portable and version-stable). Imported by benchmarks/retrieval_bench.py
(reccompile) and benchmarks/torchrec_retrieval_anchor.py (TorchRec, run with
the TorchRec venv's python).

Features and tables (embedding dim 64, pooling sum, one id per sample):
  user_id  -> table `user` (1,048,576 rows)     the query side
  item_id  -> table `item` (1,048,576 rows)     the candidate side

Model:
  q = MLP(64 -> 128 -> 64, ReLU after each layer)(pooled(user_id))   [B, 64]
  c = MLP(64 -> 128 -> 64, ReLU after each layer)(pooled(item_id))   [B, 64]
  logits = q @ C.T, C the candidates of the whole global batch        [B, G]
  loss = cross entropy against each sample's own item, mean over the batch
(TorchRec's example MLPs have a ReLU after the last layer too.) No
temperature, no normalisation, no sampling correction: the plain in-batch
softmax. A rank's loss is the mean over its samples; dense gradients are
averaged over the ranks, so N ranks train what one process does.

Optimisers: embeddings row-wise Adagrad fused into backward (lr 0.01, eps
1e-8); dense parameters torch.optim.Adagrad (lr 0.01, eps 1e-8).

Batches: GLOBAL_BATCH = 1,024 samples in every mode, so the softmax always
ranks each sample's item among 1,024 candidates: `local` trains the whole
batch in one process, `dist2` splits it in halves over two processes (gloo,
one intra-op thread each) that all-gather the candidate vectors.
NUM_BATCHES pre-generated batches cycled, DEFAULT_WARMUP untimed steps, the
median of DEFAULT_STEPS timed steps (the slowest rank's per step).
"""

import numpy as np

WORKLOAD_NAME = "retrieval-bench"

USER_ROWS = 1 << 20
ITEM_ROWS = 1 << 20
EMBEDDING_DIM = 64
TOWER = [128, 64]

GLOBAL_BATCH = 1024
EMB_LR, EMB_EPS = 0.01, 1e-8
DENSE_LR, DENSE_EPS = 0.01, 1e-8

NUM_BATCHES = 20
DATA_SEED = 8642
MODEL_SEED = 0
DEFAULT_WARMUP = 5
DEFAULT_STEPS = 50


def make_batch(batch_idx: int, rank: int = 0, world_size: int = 1):
    """Rank `rank`'s slice of global batch `batch_idx`: (user ids, item ids), int64 numpy arrays.

        rng   = np.random.default_rng(DATA_SEED + batch_idx)
        user  = rng.integers(0, USER_ROWS, size=GLOBAL_BATCH, dtype=np.int64)
        item  = rng.integers(0, ITEM_ROWS, size=GLOBAL_BATCH, dtype=np.int64)

    then samples [rank * G / N, (rank + 1) * G / N) of both.
    """
    rng = np.random.default_rng(DATA_SEED + batch_idx)
    user = rng.integers(0, USER_ROWS, size=GLOBAL_BATCH, dtype=np.int64)
    item = rng.integers(0, ITEM_ROWS, size=GLOBAL_BATCH, dtype=np.int64)
    share = GLOBAL_BATCH // world_size
    cut = slice(rank * share, (rank + 1) * share)
    return user[cut], item[cut]
