"""`reccompile train` of a two-tower retrieval spec on CSV positives: its metrics in every report.

The users' positives follow a planted rule (user u prefers movie 7u + 3
mod 80, four times in five). Training reports recall@10, ndcg@10 and mrr on
the progress lines, the evaluation lines, the run log and the final JSON
line, under the head's name: the progress lines rank each step's positives
against the step's own candidates (`sampled_recall@10`, ...), evaluation
against every movie. A model that cannot learn (every learning rate 1e-9)
reports the progress figures at chance.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from compiler.cli import main

SPEC = """\
version: 1
name: csv_retrieval
features:
  sparse:
    - {name: user_id, num_embeddings: 100, dim: 16}
    - {name: movie_id, num_embeddings: 80, dim: 16}
model:
  user_tower: {type: mlp, input: sparse.user_id, layers: [32, 16]}
  item_tower: {type: mlp, input: sparse.movie_id, layers: [32, 16]}
heads:
  - {name: match, loss: sampled_softmax, input: user_tower, item: item_tower, negatives: {in_batch: true, uniform: 20},
     logq: true, temperature: 0.1, normalize: true, metrics: [recall@10, ndcg@10, mrr]}
training:
  batch_size: 128
  dense_optimizer: {type: adam, lr: 0.01}
  sparse_optimizer: {type: rowwise_adagrad, lr: 0.1}
data:
  reader: csv
  path: train.csv
  columns: {user_id: user_id, movie_id: movie_id}
"""


def positives(path: Path, count: int, rng: random.Random) -> Path:
    lines = ["user_id,movie_id"]
    for _ in range(count):
        user = rng.randrange(100)
        movie = (user * 7 + 3) % 80 if rng.random() < 0.8 else int(80 * rng.random() ** 3)
        lines.append(f"{user},{movie}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_training_reports_the_retrieval_metrics_everywhere(tmp_path: Path, capsys) -> None:
    rng = random.Random(3)
    train, held_out = positives(tmp_path / "train.csv", 4000, rng), positives(tmp_path / "eval.csv", 500, rng)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    logs = tmp_path / "logs"
    code = main(
        [
            "train",
            str(spec),
            "-o",
            str(tmp_path / "build"),
            "--data",
            f"csv:{train}",
            "--eval-data",
            f"csv:{held_out}",
            "--steps",
            "60",
            "--log-every",
            "20",
            "--eval-every",
            "30",
            "--data-workers",
            "0",
            "--log-dir",
            str(logs),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[1:-1]] == [
        ["step", "20/60"],
        ["eval", "30/60"],
        ["step", "40/60"],
        ["step", "60/60"],
        ["eval", "60/60"],
    ]
    assert all(" match: sampled_recall@10 " in lines[i] and " sampled_mrr " in lines[i] for i in (1, 3, 4))
    assert all(" match: recall@10 " in lines[i] and " ndcg@10 " in lines[i] and " mrr " in lines[i] for i in (2, 5))
    final = json.loads(lines[-1])
    names = ["recall@10", "ndcg@10", "mrr"]
    assert list(final["metrics"]["match"]) == ["sampled_" + name for name in names]
    assert list(final["eval_metrics"]["match"]) == names
    assert final["eval_metrics"]["match"]["recall@10"] > 0.7, final  # popularity alone: about 0.2
    assert final["loss_last"] < 0.5 * final["loss_first"]
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [30, 60] and evals[-1]["metrics"] == final["eval_metrics"]


def test_a_model_that_cannot_learn_reports_chance(tmp_path: Path, capsys) -> None:
    """Every rate 1e-9: each step ranks its 128 positives among the batch's other positives and 100
    uniform negatives of 5,000 movies (about 220 distinct), so recall@10 is about 10 / 220. Ranked
    against vectors read after the step's update instead, it was 0.95 after one step."""
    rng = random.Random(4)
    train = positives(tmp_path / "train.csv", 1000, rng)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        SPEC.replace("num_embeddings: 80", "num_embeddings: 5000")
        .replace("uniform: 20", "uniform: 100")
        .replace("lr: 0.01", "lr: 1.0e-9")
        .replace("lr: 0.1", "lr: 1.0e-9")
    )
    code = main(
        [
            "train",
            str(spec),
            "-o",
            str(tmp_path / "build"),
            "--data",
            f"csv:{train}",
            "--steps",
            "8",
            "--log-every",
            "8",
            "--data-workers",
            "0",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    final = json.loads(out.splitlines()[-1])
    assert 0.015 < final["metrics"]["match"]["sampled_recall@10"] < 0.08, final  # 1,024 queries: sd about 0.007
