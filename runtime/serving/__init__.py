"""Serving: quantized tables, export directories, batch prediction."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "quant_embedding": ("PRECISIONS", "QuantEmbeddingBagCollection"),
        "quant_sequence": ("QuantEmbeddingCollection",),
        "export_dir": ("ExportError", "load", "read_export_manifest"),
        "predict": ("PredictionReport", "predict_file"),
    },
)
