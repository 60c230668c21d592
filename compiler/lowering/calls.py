"""The runtime call each IR value lowers to: the contract between the compiler and the runtime.

Every submodule of a generated model is built by a `Call` of a runtime
factory made here, from the IR alone; `instantiate` evaluates the calls in
memory and the code generator renders them as source, so both build the same
program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from compiler.ir import (
    SEQUENCE_OPS,
    STACK_OPS,
    Activation,
    Block,
    Cin,
    CrossNet,
    DenseFeature,
    Dot,
    DotProduct,
    Flatten,
    Fm,
    Gru,
    Head,
    Hstu,
    MaskNet,
    Mlp,
    ModelIR,
    Moe,
    Optimizer,
    Product,
    SelfAttention,
    SequencePool,
    Sum,
    Table,
    TargetAttention,
    Transformer,
    Wukong,
)
from compiler.lowering.types import BuildArg, Call
from runtime.config.transforms import Quantiles


def _vectors(block: Block) -> tuple[int, int]:
    """(number of vectors, their width) for dot and fm: each input is one vector, a field stack its fields."""
    return sum(item.fields or 1 for item in block.inputs), block.inputs[0].width


def block_call(block: Block, in_width: int) -> Call:
    """The runtime module of `block`, told its spec location (`where`) for its errors.

    The sequence blocks' modules take no `where`: their inputs are checked
    at compile time (compiler/spec/values.py) and their errors name the block type.
    """
    call = _block_op_call(block, in_width)
    if isinstance(block.op, SEQUENCE_OPS):
        return call
    return Call(call.factory, (*call.kwargs, ("where", str(block.loc))))


def _block_op_call(block: Block, in_width: int) -> Call:
    op = block.op
    if isinstance(op, Mlp):
        return Call(
            "runtime.modules.blocks.pooled.MLP",
            (
                ("in_features", in_width),
                ("layers", list(op.layers)),
                ("activation", op.activation),
                ("final_activation", op.final_activation),
                *(_mlp_options(op, block) if op.decorated or _dice(op) else ()),
            ),
        )
    if isinstance(op, Dot):
        num, dim = _vectors(block)
        return Call("runtime.modules.blocks.pooled.DotInteraction", (("num_vectors", num), ("dim", dim)))
    if isinstance(op, Fm):
        num, dim = _vectors(block)
        return Call(
            "runtime.modules.blocks.pooled.FactorizationMachine",
            (
                ("num_vectors", num),
                ("dim", dim),
                *((("vector", True),) if op.output == "vector" else ()),
            ),
        )
    if isinstance(op, CrossNet):
        return Call(
            "runtime.modules.blocks.pooled.CrossNet",
            (
                ("in_features", in_width),
                ("num_layers", op.num_layers),
                ("low_rank", op.low_rank),
            ),
        )
    if isinstance(op, DotProduct):
        return Call("runtime.modules.blocks.pooled.DotProduct", ())
    if isinstance(op, Sum):
        return Call("runtime.modules.blocks.pooled.Sum", ())
    if isinstance(op, Product):
        return Call("runtime.modules.blocks.elementwise.Product", ())
    if isinstance(op, Activation):
        return Call("runtime.modules.blocks.elementwise.Activation", (("activation", op.fn),))
    if isinstance(op, Moe) and op.is_ple:
        return Call(
            "runtime.modules.blocks.ple.ProgressiveLayeredExtraction",
            (
                ("in_features", in_width),
                ("shared_experts", op.num_experts),
                ("task_experts", op.task_experts),
                ("expert_layers", list(op.expert_layers)),
                ("num_tasks", len(op.tasks)),
                ("levels", op.levels),
                ("activation", op.activation),
                *(
                    (("per_level", [(shared, task, list(layers)) for shared, task, layers in op.per_level]),)
                    if op.per_level
                    else ()
                ),
            ),
        )
    if isinstance(op, Moe):
        return Call(
            "runtime.modules.blocks.pooled.MixtureOfExperts",
            (
                ("in_features", in_width),
                ("num_experts", op.num_experts),
                ("expert_layers", list(op.expert_layers)),
                ("num_tasks", len(op.tasks)),
                ("activation", op.activation),
            ),
        )
    if isinstance(op, SEQUENCE_OPS):
        return _sequence_block_call(block)
    if isinstance(op, STACK_OPS):
        return _stack_block_call(block)
    raise TypeError(f"block {block.name!r}: no lowering for {type(op).__name__}")


def _mlp_options(op: Mlp, block: Block) -> tuple[tuple[str, object], ...]:
    """norm, dropout and residual; batch norm's and Dice's all-reduce and dropout's global sample index need the
    process group, and dropout's masks the training seed with the block's name (stable across recompiles)."""
    return (
        ("norm", op.norm),
        ("dropout", op.dropout),
        ("residual", op.residual),
        *((("seed", _block_seed(block)),) if op.dropout > 0 else ()),
        *((("process_group", BuildArg("process_group")),) if op.norm == "batch" or op.dropout > 0 or _dice(op) else ()),
    )


def _dice(op: Mlp) -> bool:
    """Dice normalises by the global batch's statistics, all-reduced over the process group."""
    return "dice" in (op.activation, op.final_activation)


def _block_seed(block: Block) -> int:
    """A 31-bit seed per block: its name's bytes hashed with FNV-1a (the same on every run and rank)."""
    h = 0x811C9DC5
    for byte in block.name.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


def _transformer_options(op: Transformer, block: Block) -> tuple[tuple[str, object], ...]:
    """The options away from their defaults only, so the calls of specs that use none stay as they were."""
    dropout = op.dropout > 0 or op.input_dropout > 0
    return (
        *((("sasrec", True),) if op.norm == "sasrec" else ()),
        *((("norm_affine", False),) if not op.norm_affine else ()),
        *((("scale_input", True),) if op.scale_input else ()),
        *((("dropout", op.dropout),) if op.dropout > 0 else ()),
        *((("input_dropout", op.input_dropout),) if op.input_dropout > 0 else ()),
        *((("seed", _block_seed(block)), ("process_group", BuildArg("process_group"))) if dropout else ()),
        *((("position_dim", op.position_dim),) if op.position_dim else ()),
    )


def _hstu_options(op: Hstu, block: Block) -> tuple[tuple[str, object], ...]:
    """The options away from their defaults only, so the calls of specs that use none stay as they were."""
    dropout = op.dropout > 0 or op.input_dropout > 0
    return (
        *((("dropout", op.dropout),) if op.dropout > 0 else ()),
        *((("scale_input", True),) if op.scale_input else ()),
        *((("positions", True),) if op.positions == "learned" else ()),
        *((("input_dropout", op.input_dropout),) if op.input_dropout > 0 else ()),
        *((("seed", _block_seed(block)), ("process_group", BuildArg("process_group"))) if dropout else ()),
    )


def _sequence_block_call(block: Block) -> Call:
    op, dim = block.op, block.inputs[0].width
    if isinstance(op, SequencePool):
        return Call("runtime.modules.blocks.sequence_pool.SequencePool", (("dim", dim), ("mode", op.mode)))
    if isinstance(op, TargetAttention):
        return Call(
            "runtime.modules.blocks.target_attention.TargetAttention",
            (
                ("dim", sum(item.width for item in block.inputs)),
                ("hidden", list(op.hidden)),
                ("activation", op.activation),
                *((("normalize", op.normalize),) if op.normalize != "none" else ()),
            ),
        )
    if isinstance(op, Transformer):
        assert block.length is not None
        return Call(
            "runtime.modules.blocks.transformer.Transformer",
            (
                ("dim", dim),
                ("num_heads", op.num_heads),
                ("ffn_dim", op.ffn_dim),
                ("num_layers", op.num_layers),
                ("norm_first", op.norm == "pre"),
                ("causal", op.causal),
                ("max_length", block.length if op.positions != "none" else 0),
                ("activation", op.activation),
                *_transformer_options(op, block),
            ),
        )
    if isinstance(op, Gru):
        return Call(
            "runtime.modules.blocks.gru.GRU",
            (
                ("dim", dim),
                ("hidden_size", op.hidden_size),
                ("num_layers", op.num_layers),
                *(
                    (
                        ("query_dim", op.query.width),
                        ("attention", op.attention),
                        ("softmax", op.attention_softmax),
                    )
                    if op.query is not None
                    else ()
                ),
            ),
        )
    assert isinstance(op, Hstu) and block.length is not None
    return Call(
        "runtime.modules.blocks.hstu.hstu_layers",
        (
            ("num_layers", op.num_layers),
            ("dim", dim),
            ("num_heads", op.num_heads),
            ("attention_dim", op.attention_dim),
            ("linear_dim", op.linear_dim),
            ("max_length", block.length),
            ("num_buckets", op.num_buckets),
            *_hstu_options(op, block),
        ),
    )


def _stack_block_call(block: Block) -> Call:
    op, stack = block.op, block.inputs[0]
    assert stack.fields is not None
    shape = (("num_fields", stack.fields), ("dim", stack.width))
    if isinstance(op, Flatten):
        return Call("runtime.modules.blocks.field_stack.Flatten", shape)
    if isinstance(op, SelfAttention):
        return Call(
            "runtime.modules.blocks.field_attention.FieldSelfAttention",
            (
                *shape,
                ("head_dim", op.attention_dim),
                ("num_heads", op.num_heads),
                ("num_layers", op.num_layers),
                ("residual", op.residual),
                *((("residual_projection", False),) if not op.residual_projection else ()),
            ),
        )
    if isinstance(op, Cin):
        return Call(
            "runtime.modules.blocks.cin.CIN",
            (
                *shape,
                ("layer_sizes", list(op.layer_sizes)),
                ("split_half", op.split_half),
                *((("bias", True),) if op.bias else ()),
            ),
        )
    if isinstance(op, Wukong):
        return Call(
            "runtime.modules.blocks.wukong.Wukong",
            (
                *shape,
                ("num_layers", op.num_layers),
                ("num_fmb", op.num_fmb),
                ("num_lcb", op.num_lcb),
                ("rank", op.rank),
                ("fmb_layers", list(op.fmb_layers)),
                ("activation", op.activation),
            ),
        )
    assert isinstance(op, MaskNet)
    return Call(
        "runtime.modules.blocks.mask_block.MaskNet",
        (
            *shape,
            ("mode", op.mode),
            ("block_sizes", list(op.block_sizes)),
            ("reduction_ratio", op.reduction_ratio),
            ("emb_layer_norm", op.emb_layer_norm),
            ("layer_norm", op.layer_norm),
            ("layers", list(op.layers)),
            *((("emb_norm_scope", op.emb_norm_scope),) if op.emb_norm_scope != "field" else ()),
        ),
    )


def numeric_embedding_call(feature: DenseFeature) -> Call:
    """The module that makes a dense feature with `embed` a field stack [B, size, dim]."""
    assert feature.embed_dim is not None
    return Call(
        "runtime.modules.blocks.field_stack.NumericEmbedding",
        (
            ("size", feature.size),
            ("dim", feature.embed_dim),
            ("bias", feature.embed_bias),
            ("where", str(feature.loc)),
        ),
    )


def optimizer_call(optimizer: Optimizer) -> Call:
    return Call(
        "runtime.config.embeddings.EmbeddingOptimizer",
        (
            ("type", optimizer.type),
            ("lr", optimizer.lr),
            ("eps", optimizer.eps),
            ("weight_decay", optimizer.weight_decay),
            ("beta1", optimizer.beta1),
            ("beta2", optimizer.beta2),
            *((("embedding_l2", optimizer.embedding_l2),) if optimizer.embedding_l2 else ()),
        ),
    )


def table_config_call(table: Table, training: bool = True) -> Call:
    """The table's runtime.config.embeddings.EmbeddingBagConfig; serving needs no init range or optimizer."""
    shape = (
        ("name", table.name),
        ("num_embeddings", table.num_embeddings),
        ("embedding_dim", table.dim),
        ("feature_names", list(table.features)),
        ("pooling", table.pooling),
    )
    where = (("where", str(table.loc)),)
    if not training:
        return Call("runtime.config.embeddings.EmbeddingBagConfig", (*shape, *where))
    return Call(
        "runtime.config.embeddings.EmbeddingBagConfig",
        (
            *shape,
            ("weight_init_min", table.init_min),
            ("weight_init_max", table.init_max),
            ("optimizer", optimizer_call(table.optimizer)),
            *where,
        ),
    )


def sequence_table_config_call(table: Table) -> Call:
    """A sequence table's runtime.config.embeddings.EmbeddingConfig (all its features read as rows)."""
    return Call(
        "runtime.config.embeddings.EmbeddingConfig",
        (
            ("name", table.name),
            ("num_embeddings", table.num_embeddings),
            ("embedding_dim", table.dim),
            ("feature_names", list(table.features)),
            ("weight_init_min", table.init_min),
            ("weight_init_max", table.init_max),
            ("optimizer", optimizer_call(table.optimizer)),
            ("where", str(table.loc)),
        ),
    )


def sparse_arch_call(ir: ModelIR) -> Call:
    """The SparseArch: pooled tables on bag collections, sequence tables (if any) as rows."""
    sequence_tables = ir.sequence_tables()
    pooled = [table for table in ir.tables if table not in sequence_tables]
    sequences = (("sequence_tables", [sequence_table_config_call(t) for t in sequence_tables]),)
    return Call(
        "runtime.sharding.SparseArch",
        (
            ("tables", [table_config_call(table) for table in pooled]),
            ("optimizer", optimizer_call(ir.training.sparse_optimizer)),
            ("plan", BuildArg("plan")),
            ("process_group", BuildArg("process_group")),
            ("device", BuildArg("device")),
            ("is_weighted", any(feature.weighted for feature in ir.sparse)),
            *(sequences if sequence_tables else ()),
        ),
    )


POSITION_WEIGHTS = "_position_weights"  # the model's module of position-weighted pools (no block name starts with _)


def position_weights_call(ir: ModelIR) -> Call:
    """The position-weighted pools of `ir`'s position-weighted features, one per feature."""
    return Call(
        "runtime.modules.layers.position_weights.PositionWeights",
        (
            (
                "pools",
                [
                    Call(
                        "runtime.modules.layers.position_weights.PositionWeightedPool",
                        (
                            ("max_ids", f.ids_per_sample),
                            ("mode", ir.table(f.table).pooling),
                            ("feature", f.name),
                            ("where", str(f.loc)),
                        ),
                    )
                    for f in ir.sparse
                    if f.position_weighted
                ],
            ),
        ),
    )


def head_config_call(head: Head) -> Call:
    """The head as the runtime's loss, metrics and prediction read it."""
    return Call(
        "runtime.config.heads.HeadConfig",
        (
            ("name", head.name),
            ("loss", head.loss),
            ("label", head.label),
            ("weight", head.weight),
            ("num_classes", head.num_classes),
            ("metrics", head.metrics),
            *((("output", head.output),) if head.output != "logit" else ()),
            *((("mask_seen", False),) if head.retrieval is not None and not head.retrieval.mask_seen else ()),
            ("where", str(head.loc)),
        ),
    )


def dense_optimizer_call(ir: ModelIR) -> Call:
    """The optimizer of the dense parameters (the training section's `dense_optimizer`)."""
    optimizer = ir.training.dense_optimizer
    return Call(
        "runtime.config.training.DenseOptimizerConfig",
        (
            ("type", optimizer.type),
            ("lr", optimizer.lr),
            ("eps", optimizer.eps),
            ("weight_decay", optimizer.weight_decay),
            ("beta1", optimizer.beta1),
            ("beta2", optimizer.beta2),
            ("where", str(ir.training.loc)),
        ),
    )


def lr_schedule_call(ir: ModelIR) -> Call:
    """The learning-rate schedule of every optimizer (the training section's `lr_schedule`)."""
    schedule = ir.training.lr_schedule
    params = (
        ("type", schedule.type),
        ("warmup_steps", schedule.warmup_steps),
        ("start_factor", schedule.start_factor),
        ("step_size", schedule.step_size),
        ("gamma", schedule.gamma),
        ("total_steps", schedule.total_steps),
        ("final_factor", schedule.final_factor),
    )
    where = () if schedule.loc is None else (("where", str(schedule.loc)),)
    return Call("runtime.config.lr_schedule.LrSchedule", (*((k, v) for k, v in params if v is not None), *where))


def model_inputs_call(ir: ModelIR) -> Call:
    """The model's features, heads (the module's HEADS), training defaults and data section."""
    rows = {table.name: table.num_embeddings for table in ir.tables}
    dense = [
        Call(
            "runtime.config.data.DenseFeatureConfig",
            (
                ("name", f.name),
                ("size", f.size),
                ("where", str(f.loc)),
                *((("transform", _config_call(f.transform)),) if f.transform is not None else ()),
            ),
        )
        for f in ir.dense
    ]
    sparse = [
        Call(
            "runtime.config.data.SparseFeatureConfig",
            (
                ("name", f.name),
                ("table", f.table),
                ("num_embeddings", rows[f.table]),
                ("ids_per_sample", f.ids_per_sample),
                ("fixed_ids", f.fixed_ids),
                ("weighted", f.weighted),
                *((("max_length", f.max_length), ("keep", f.keep)) if f.is_sequence else ()),
                *((("column", f.column),) if f.column is not None else ()),
                *((("column_index", f.column_index), ("boundaries", f.boundaries)) if f.boundaries else ()),
                *((("column_index", f.column_index),) if isinstance(f.transform, Quantiles) else ()),
                ("where", str(f.loc)),
                *((("transform", _config_call(f.transform)),) if f.transform is not None else ()),
            ),
        )
        for f in ir.sparse
    ]
    timestamps = [
        Call(
            "runtime.config.data.TimestampsConfig",
            (
                ("name", t.name),
                ("sequence", t.sequence),
                ("where", str(t.loc)),
            ),
        )
        for t in ir.timestamps
    ]
    stopping, plateau = ir.training.early_stopping, ir.training.lr_plateau
    training = Call(
        "runtime.config.training.TrainingConfig",
        (
            ("steps", ir.training.steps),
            ("batch_size", ir.training.batch_size),
            ("seed", ir.training.seed),
            ("where", str(ir.training.loc)),
            *(
                ()
                if stopping is None
                else (
                    ("best_metric", stopping.metric),
                    ("patience", stopping.patience),
                    ("early_stopping_where", str(stopping.loc)),
                )
            ),
            *(
                ()
                if plateau is None
                else (
                    (
                        "lr_plateau",
                        Call(
                            "runtime.config.training.PlateauConfig",
                            (
                                ("metric", plateau.metric),
                                ("mode", plateau.mode),
                                ("factor", plateau.factor),
                                ("patience", plateau.patience),
                                ("min_factor", plateau.min_factor),
                                ("threshold", plateau.threshold),
                                ("where", str(plateau.loc)),
                            ),
                        ),
                    ),
                )
            ),
            *(
                ()
                if ir.training.precision == "fp32"
                else (
                    ("precision", ir.training.precision),
                    ("precision_where", str(ir.training.precision_loc or ir.training.loc)),
                )
            ),
        ),
    )
    data = (
        None
        if ir.data is None
        else Call(
            "runtime.config.data.DataConfig",
            (
                ("reader", ir.data.reader),
                ("path", ir.data.path),
                ("columns", ir.data.columns),
                ("where", str(ir.data.loc)),
            ),
        )
    )
    return Call(
        "runtime.config.data.ModelInputs",
        (
            ("dense", dense),
            ("sparse", sparse),
            ("heads", BuildArg("HEADS")),
            ("training", training),
            ("data", data),
            ("device", ir.sharding.device),
            *((("timestamps", timestamps),) if timestamps else ()),
        ),
    )


def _config_call(config: Any) -> Call:
    """A feature transform's config (runtime.config.transforms) as the call that builds it."""
    fields = tuple((field.name, getattr(config, field.name)) for field in dataclasses.fields(config))
    return Call(f"runtime.config.transforms.{type(config).__name__}", fields)


def item_attributes_call(ir: ModelIR, head: Head) -> Call | None:
    """The item catalogue of a head whose item tower reads attributes (runtime.retrieval.item_attributes), or None."""
    retrieval = head.retrieval
    if retrieval is None or not retrieval.attributes:
        return None
    return Call(
        "runtime.retrieval.item_attributes.ItemAttributes",
        (
            ("num_items", ir.table(retrieval.item_table).num_embeddings),
            ("features", list(retrieval.attributes)),
            ("on_conflict", retrieval.on_conflict),
        ),
    )


def retrieval_loss_call(ir: ModelIR, head: Head) -> Call:
    """The loss of a sampled_softmax head: runtime.retrieval's sampled softmax over its item table."""
    retrieval = head.retrieval
    assert retrieval is not None
    rows = ir.table(retrieval.item_table).num_embeddings
    negatives = Call(
        "runtime.config.retrieval.Negatives",
        (
            ("in_batch", retrieval.in_batch),
            ("uniform", retrieval.uniform),
            *((("per_query", True),) if retrieval.per_query else ()),
        ),
    )
    config = Call(
        "runtime.config.retrieval.SampledSoftmaxConfig",
        (
            ("negatives", negatives),
            ("num_items", rows),
            ("temperature", retrieval.temperature),
            ("normalize", retrieval.normalize),
            ("logq", retrieval.logq),
            ("frequency_slots", rows),  # an id per slot: the item table's rows
            ("seed", ir.training.seed),
        ),
    )
    return Call(
        "runtime.retrieval.head.RetrievalLoss",
        (
            ("config", config),
            ("process_group", BuildArg("process_group")),
        ),
    )


def aux_loss_blocks(ir: ModelIR) -> list[Block]:
    """The gru blocks whose `aux_loss` builds a loss term (weight > 0), in model order."""
    return [
        block
        for block in ir.blocks
        if isinstance(block.op, Gru) and block.op.aux_loss is not None and block.op.aux_loss.weight > 0
    ]


def aux_loss_call(ir: ModelIR, block: Block) -> Call:
    """The NextBehaviourLoss of a gru with `aux_loss`: its negatives are rows of its sparse feature's
    table, drawn from the training seed (as a retrieval head's)."""
    op, sequence = block.op, block.inputs[0]
    assert isinstance(op, Gru) and op.aux_loss is not None and sequence.length is not None
    table = ir.table(ir.feature(sequence.name).table)
    config = Call(
        "runtime.config.retrieval.NextBehaviourConfig",
        (
            ("weight", op.aux_loss.weight),
            ("num_items", table.num_embeddings),
            ("max_length", sequence.length),
            ("seed", ir.training.seed),
        ),
    )
    return Call(
        "runtime.retrieval.next_behaviour.NextBehaviourLoss",
        (
            ("config", config),
            ("hidden_size", op.hidden_size),
            ("item_dim", sequence.width),
            ("process_group", BuildArg("process_group")),
        ),
    )
