"""The public API: every name of `runtime` and of each package resolves, lazily.

`import runtime` (and a torch-free module under it) must not import torch or
fbgemm_gpu: the compiler imports torch-free runtime modules, and a package's
re-exports are only imported when read.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import runtime

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (ROOT / "runtime").iterdir() if (p / "__init__.py").is_file())


def test_runtime_holds_only_packages() -> None:
    loose = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    assert PACKAGES == [
        "checkpoint",
        "config",
        "cpu",
        "data",
        "embeddings",
        "features",
        "modules",
        "process",
        "reporting",
        "retrieval",
        "serving",
        "sharding",
        "sparse",
        "storage",
        "train",
    ]


# A package's names are its own but for these: TorchRec's table configs, which TorchRec's users
# import from `runtime.embeddings` (as from torchrec), live in the contract room; the checkpoint
# store's `Stateful` is torch.distributed.checkpoint's own protocol.
RE_EXPORTS = {
    ("runtime.embeddings", name): "runtime.config.embeddings"
    for name in ("EmbeddingBagConfig", "EmbeddingConfig", "EmbeddingOptimizer")
} | {("runtime.checkpoint", "Stateful"): "torch.distributed.checkpoint.stateful"}  # the protocol its states follow


@pytest.mark.parametrize("package", ["", *PACKAGES])
def test_every_exported_name_resolves_to_its_definition(package: str) -> None:
    module = importlib.import_module(f"runtime.{package}" if package else "runtime")
    assert module.__all__, f"{module.__name__} exports nothing"
    for name in module.__all__:
        value = getattr(module, name)
        assert name in dir(module)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__name__ == name
            home = RE_EXPORTS.get((module.__name__, name), module.__name__)
            assert value.__module__.startswith(home), (name, value.__module__)
            assert not inspect.ismodule(value)


def test_the_top_level_names_are_the_packages_own() -> None:
    from runtime.config.embeddings import EmbeddingBagConfig
    from runtime.embeddings.bag_collection import EmbeddingBagCollection
    from runtime.serving.quant_embedding import QuantEmbeddingBagCollection
    from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
    from runtime.train.train_pipeline import TrainPipeline

    assert (runtime.KeyedJaggedTensor, runtime.JaggedTensor, runtime.KeyedTensor) == (
        KeyedJaggedTensor,
        JaggedTensor,
        KeyedTensor,
    )
    assert (runtime.EmbeddingBagConfig, runtime.EmbeddingBagCollection) == (EmbeddingBagConfig, EmbeddingBagCollection)
    assert runtime.QuantEmbeddingBagCollection is QuantEmbeddingBagCollection
    assert runtime.TrainPipeline is TrainPipeline


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError) as raised:
        runtime.sparse.KeyedJaggedTensr  # noqa: B018
    assert str(raised.value) == "module 'runtime.sparse' has no attribute 'KeyedJaggedTensr'"


def test_importing_the_runtime_does_not_import_torch() -> None:
    code = (
        "import sys, runtime, runtime.storage.manifest\n"
        f"for package in {PACKAGES!r}:\n"
        "    __import__('runtime.' + package)\n"
        "dir(runtime); runtime.__all__\n"
        "print(sorted(m for m in ('torch', 'fbgemm_gpu', 'numpy', 'compiler') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"
