"""Item indexes: exact search against brute force, FAISS against exact, files on disk, quality figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.retrieval import index_files
from runtime.retrieval.index import ExactIndex, FaissIndex, build_index, faiss_available
from runtime.retrieval.index_files import IndexFileError, load_index, save_index
from runtime.retrieval.index_quality import IndexQuality, check_index, held_out_recall, top_k_overlap
from runtime.storage.manifest import file_sha256

needs_faiss = pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed (reccompile[faiss])")


def _items(count: int = 500, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clustered embeddings (as trained towers give) and ids that are not row numbers."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(20, dim, generator=generator) * 3
    members = torch.randint(0, 20, (count,), generator=generator)
    embeddings = centres[members] + torch.randn(count, dim, generator=generator)
    return embeddings, torch.arange(count) * 10 + 3


def _brute_force(embeddings: torch.Tensor, ids: torch.Tensor, queries: torch.Tensor, k: int) -> np.ndarray:
    scores = queries.numpy().astype(np.float64) @ embeddings.numpy().astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return ids.numpy()[order]


def test_exact_search_is_brute_force_across_chunks() -> None:
    embeddings, ids = _items()
    queries = torch.randn(30, 16, generator=torch.Generator().manual_seed(1))
    index = ExactIndex(embeddings, ids, chunk_size=37)
    scores, found = index.search(queries, 10)
    assert found.numpy().tolist() == _brute_force(embeddings, ids, queries, 10).tolist()
    expected_scores = (queries @ embeddings.T).topk(10, dim=1).values
    torch.testing.assert_close(scores, expected_scores, rtol=1e-6, atol=1e-5)


def test_asking_for_more_than_the_table_pads_with_minus_one() -> None:
    index = build_index(torch.eye(3), torch.tensor([7, 8, 9]), kind="exact")
    scores, found = index.search(torch.tensor([[0.0, 2.0, 1.0]]), k=5)
    assert found.tolist() == [[8, 9, 7, -1, -1]]
    assert scores.tolist() == [[2.0, 1.0, 0.0, float("-inf"), float("-inf")]]


@needs_faiss
def test_faiss_flat_finds_what_exact_search_does() -> None:
    embeddings, ids = _items()
    queries = torch.randn(30, 16, generator=torch.Generator().manual_seed(2))
    flat = build_index(embeddings, ids, kind="flat")
    assert isinstance(flat, FaissIndex)
    assert flat.search(queries, 10)[1].numpy().tolist() == _brute_force(embeddings, ids, queries, 10).tolist()
    assert build_index(embeddings, ids).kind == "flat"  # auto, a small table


@needs_faiss
@pytest.mark.parametrize(("kind", "options"), [("ivf", dict(nlist=8, nprobe=4)), ("hnsw", dict(hnsw_m=16))])
def test_approximate_indexes_stay_close_to_exact_search(kind: str, options: dict) -> None:
    embeddings, ids = _items(2000)
    index = build_index(embeddings, ids, kind=kind, **options)
    queries = embeddings[:200] + 0.3 * torch.randn(200, 16, generator=torch.Generator().manual_seed(3))
    exact = build_index(embeddings, ids, kind="exact")
    quality = check_index(index, exact, queries, k=20)
    assert quality.kind == kind and quality.k == 20
    assert quality.ok and quality.overlap >= 0.95, quality.describe()
    held_out = check_index(index, exact, queries, k=20, positive_ids=ids[:200])
    assert held_out.overlap == quality.overlap
    assert held_out.recall == held_out_recall(index.search(queries, 20)[1], ids[:200])
    assert held_out.exact_recall == held_out_recall(exact.search(queries, 20)[1], ids[:200])


def _save_and_load(index, path: Path):
    save_index(index, path)
    return load_index(path)


@pytest.mark.parametrize("kind", ["exact", "flat", "ivf", "hnsw"])
def test_an_index_reloads_with_the_same_answers(tmp_path: Path, kind: str) -> None:
    if kind != "exact" and not faiss_available():
        pytest.skip("faiss-cpu is not installed (reccompile[faiss])")
    embeddings, ids = _items(800)
    index = build_index(embeddings, ids, kind=kind, nlist=16, nprobe=3, ef_search=40)
    loaded = _save_and_load(index, tmp_path / "items")
    queries = torch.randn(20, 16, generator=torch.Generator().manual_seed(4))
    assert torch.equal(loaded.search(queries, 15)[1], index.search(queries, 15)[1])
    assert loaded.kind == kind and loaded.params == index.params
    manifest = json.loads((tmp_path / "items" / "manifest.json").read_text())
    assert (manifest["format"], manifest["format_version"], manifest["kind"]) == ("reccompile-index", 1, kind)
    assert (manifest["count"], manifest["dim"]) == (800, 16)
    data = "embeddings.pt" if kind == "exact" else "index.faiss"
    assert sorted(manifest["files"]) == sorted(["ids.pt", data])


def test_a_changed_file_is_named(tmp_path: Path) -> None:
    embeddings, ids = _items(50)
    save_index(build_index(embeddings, ids, kind="exact"), tmp_path)
    path = tmp_path / "embeddings.pt"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    with pytest.raises(IndexFileError) as error:
        load_index(tmp_path)
    assert str(error.value) == (
        f"{path}: sha256 {file_sha256(path)[:12]}… does not match manifest.json "
        f"({manifest['files']['embeddings.pt']['sha256'][:12]}…); the file was changed or corrupted, "
        "build the index again"
    )
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(IndexFileError) as error:
        load_index(tmp_path)
    size = manifest["files"]["embeddings.pt"]["bytes"]
    assert str(error.value) == (
        f"{path}: {size - 10:,} bytes, manifest.json says {size:,}; the index is incomplete or corrupted, build the index again"
    )


def test_a_directory_without_an_index_is_named(tmp_path: Path) -> None:
    with pytest.raises(IndexFileError) as error:
        load_index(tmp_path)
    assert str(error.value) == (
        f"{tmp_path}: no manifest.json; not an index directory (build one with save_index or reccompile export)"
    )
    with pytest.raises(IndexFileError) as error:
        load_index(tmp_path / "absent")
    assert str(error.value) == f"index directory {tmp_path / 'absent'} does not exist"


@needs_faiss
def test_a_faiss_index_without_faiss_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embeddings, ids = _items(100)
    save_index(build_index(embeddings, ids, kind="hnsw"), tmp_path)
    monkeypatch.setattr(index_files, "faiss_available", lambda: False)
    with pytest.raises(IndexFileError) as error:
        load_index(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'index.faiss'}: a faiss 'hnsw' index, and faiss is not installed "
        "(pip install 'reccompile[faiss]', or export again with index kind 'exact')"
    )


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError) as error:
        build_index(torch.zeros(3, 2), kind="lsh")
    assert str(error.value) == "index kind 'lsh' is not one of auto, exact, flat, ivf, hnsw"
    with pytest.raises(ValueError) as error:
        build_index(torch.zeros(3, 2), torch.arange(4))
    assert str(error.value) == "index: 4 ids for 3 embeddings"
    with pytest.raises(ValueError) as error:
        build_index(torch.zeros(0, 2))
    assert str(error.value) == "index: embeddings must be [N, D] with N >= 1 (got shape [0, 2])"


def test_quality_figures_by_hand() -> None:
    found = torch.tensor([[1, 2, 3], [4, 5, -1]])
    exact = torch.tensor([[1, 2, 9], [4, 5, 6]])
    assert top_k_overlap(found, exact) == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert held_out_recall(found, torch.tensor([3, 6])) == 0.5
    assert held_out_recall(found, torch.tensor([[1, 9], [-1, -1]])) == 0.5  # the second query has none
    quality = IndexQuality("ivf", 3, overlap=2 / 3, recall=0.45, exact_recall=0.5, threshold=0.95)
    assert quality.ratio == pytest.approx(0.9) and not quality.ok
    assert quality.describe() == (
        "index ivf: recall@3 0.4500 vs exact 0.5000 (ratio 0.9000), top-3 overlap 0.6667: BELOW 0.95 of exact search"
    )
    plain = IndexQuality("hnsw", 100, overlap=0.97, recall=None, exact_recall=None, threshold=0.95)
    assert plain.ok and plain.describe() == "index hnsw: top-100 overlap with exact search 0.9700: ok (>= 0.95)"
