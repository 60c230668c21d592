"""The contract between the compiler and the runtime: the frozen configs a generated module hands the runtime.

A generated module builds its INPUTS, HEADS, DENSE_OPTIMIZER, LR_SCHEDULE,
its tables and its retrieval head from these types and nothing else; every
runtime package reads them. They import no torch (a test checks it in a fresh
interpreter), so the data readers, reporting and serving need no model
package to reach one, and `runtime.config` is the runtime's bottom layer
(pyproject.toml's import-linter contract).

    data          ModelInputs: DenseFeatureConfig, SparseFeatureConfig, TimestampsConfig, DataConfig
    heads         HeadConfig
    training      TrainingConfig, PlateauConfig, DenseOptimizerConfig
    lr_schedule   LrSchedule (and its formulas, which the compiler checks specs with)
    embeddings    EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer (TorchRec's names;
                  `runtime` and `runtime.embeddings` re-export them, as `torchrec` does)
    retrieval     SampledSoftmaxConfig and its Negatives
    transforms    the learned feature transforms: Vocabulary, Cross, Quantiles, History, Numeric, Aggregate

tests/compiler/test_contract_types.py pins each compiler IR type to its
runtime twin here, field by field.
"""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "data": ("DataConfig", "DenseFeatureConfig", "ModelInputs", "SparseFeatureConfig", "TimestampsConfig"),
        "heads": ("HeadConfig",),
        "training": ("DenseOptimizerConfig", "PlateauConfig", "TrainingConfig"),
        "lr_schedule": ("LrSchedule",),
        "embeddings": ("EmbeddingBagConfig", "EmbeddingConfig", "EmbeddingOptimizer"),
        "retrieval": ("Negatives", "SampledSoftmaxConfig"),
        "transforms": ("Aggregate", "Cross", "History", "Numeric", "Quantiles", "Vocabulary"),
    },
)
