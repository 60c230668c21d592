"""reccompile runtime: the library that generated modules import. It never imports the compiler.

The public API is importable from here, as TorchRec's is from `torchrec`:

    from runtime import KeyedJaggedTensor, EmbeddingBagCollection, TrainPipeline

and each package re-exports its own public names (`runtime.sparse`,
`runtime.embeddings`, ...). Every name is imported on first use (PEP 562), so
`import runtime` and torch-free modules such as `runtime.storage.manifest`
do not import torch or fbgemm_gpu.

Packages, lowest layer first (each imports only from the layers below it;
pyproject.toml's import-linter contract checks it): `config` (the frozen,
torch-free configs a generated module hands the runtime) < `sparse`, `storage`,
`cpu`, `process`, `features` < `embeddings`, `modules` < `retrieval` (its
losses run their products as the linears do) < `sharding` < `data` <
`reporting` < `checkpoint` < `train`, `serving`.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, MutableMapping, Sequence

# The package index has other distributions whose top-level package is `runtime`: the compiler
# checks this mark at import, so a foreign `runtime` earlier on sys.path is named, not half-used.
DISTRIBUTION = "reccompile"


def lazy_exports(namespace: MutableMapping[str, Any], exports: Mapping[str, Sequence[str]]) -> None:
    """Give a package `__all__`, `__dir__` and a PEP 562 `__getattr__` over `exports`.

    `exports` maps a submodule (relative to the package, e.g. "jagged" or
    "sparse.jagged"; or absolute, "runtime.config.embeddings", for a name the
    package re-exports from elsewhere) to the names it provides; a name is
    imported from its module when first read, then kept in the package's namespace.
    """
    package = namespace["__name__"]
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home_module = module if module.startswith("runtime.") else f"{package}.{module}"
        value = getattr(importlib.import_module(home_module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    namespace["__all__"] = sorted(home)
    namespace["__getattr__"] = __getattr__
    namespace["__dir__"] = __dir__


lazy_exports(
    globals(),
    {
        "sparse": ("JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"),
        "embeddings": (
            "EmbeddingBagCollection",
            "EmbeddingBagConfig",
            "EmbeddingCollection",
            "EmbeddingConfig",
            "EmbeddingOptimizer",
        ),
        "modules": (
            "MLP",
            "Concat",
            "CrossNet",
            "DotInteraction",
            "DotProduct",
            "FactorizationMachine",
            "MixtureOfExperts",
            "Sum",
        ),
        "sharding": ("SparseArch", "distribute_dense"),
        "data": ("Batch",),
        "reporting": ("MetricSet",),
        "checkpoint": ("CheckpointError", "load_checkpoint", "load_model_state", "save_checkpoint"),
        "train": ("TrainPipeline", "make_dense_optimizer"),
        "serving": ("ExportError", "QuantEmbeddingBagCollection", "QuantEmbeddingCollection"),
    },
)
