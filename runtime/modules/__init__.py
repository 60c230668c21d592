"""The dense side of a model: the block types of the spec (`blocks/`), the layers they are built
from (`layers/`: linears, dropout, norms, activations), the heads' losses (`heads/`)."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "blocks.pooled": (
            "MLP",
            "Concat",
            "CrossNet",
            "DotInteraction",
            "DotProduct",
            "FactorizationMachine",
            "MixtureOfExperts",
            "Sum",
        ),
        "layers.linear": ("Linear",),
        "blocks.elementwise": ("Activation", "Product"),
        "blocks.field_stack": ("Flatten",),
        "blocks.field_attention": ("FieldSelfAttention",),
        "blocks.cin": ("CIN",),
        "blocks.wukong": ("Wukong", "WukongLayer"),
        "blocks.mask_block": ("MaskBlock", "MaskNet"),
        "layers.sync_norm": ("SyncBatchNorm",),
        "layers.dropout": ("KeyedDropout",),
        "blocks.sequence_pool": ("SequencePool",),
        "blocks.target_attention": ("TargetAttention",),
        "blocks.transformer": ("Transformer",),
        "blocks.hstu": ("HSTU",),
        "blocks.gru": ("GRU",),
        "heads.losses": ("head_loss", "total_loss"),
    },
)
