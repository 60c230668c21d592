"""The dense side of a model: the block types of the spec, linears, losses."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(
    globals(),
    {
        "blocks": (
            "MLP", "Concat", "CrossNet", "DotInteraction", "DotProduct",
            "FactorizationMachine", "MixtureOfExperts", "Sum",
        ),
        "linear": ("Linear",),
        "elementwise": ("Activation", "Product"),
        "field_stack": ("Flatten",),
        "field_attention": ("FieldSelfAttention",),
        "cin": ("CIN",),
        "wukong": ("Wukong", "WukongLayer"),
        "mask_block": ("MaskBlock", "MaskNet"),
        "sync_norm": ("SyncBatchNorm",),
        "dropout": ("KeyedDropout",),
        "sequence_pool": ("SequencePool",),
        "target_attention": ("TargetAttention",),
        "transformer": ("Transformer",),
        "hstu": ("HSTU",),
        "gru": ("GRU",),
        "losses": ("head_loss", "total_loss"),
    },
)  # fmt: skip
