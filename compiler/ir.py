"""The model IR: the frozen, fully resolved form of a spec.

Built by `compiler.spec.build` from a validated spec; read by the planner, the
lowering and the code generator. Every node keeps the spec location it came
from, every default is filled in, `count:` expansions are done, and every
block's output width is known. Nothing here changes after construction:
passes make new values with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from runtime.config.transforms import DenseTransform, SparseTransform  # the transforms learned from the data
from runtime.sharding.types import ComputeKernel, ShardingType  # named once, for planner and runtime

Pooling = Literal["sum", "mean"]
Keep = Literal["end", "start"]  # which positions a sequence longer than its max_length keeps
LossType = Literal["bce", "mse", "softmax", "sampled_softmax"]
AttributeConflict = Literal["last", "error"]  # runtime.retrieval.item_attributes.CONFLICTS
OptimizerType = Literal["sgd", "adagrad", "rowwise_adagrad", "adam", "adamw"]
LrScheduleType = Literal["constant", "step", "exponential", "linear", "cosine"]
Device = Literal["cpu", "cuda"]
INT64_MAX = (1 << 63) - 1  # the largest count or size the IR holds: the runtime's tensors index in int64


@dataclass(frozen=True, slots=True)
class Location:
    """A position in a spec file; lines and columns count from 1."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Optimizer:
    """An optimizer and its hyper-parameters (unused ones keep their defaults)."""

    type: OptimizerType
    lr: float
    eps: float = 1e-8
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    embedding_l2: float = 0.0  # tables only: (l2 / 2) ||w_r||^2 per distinct row a step reads


@dataclass(frozen=True, slots=True)
class DenseFeature:
    """A float vector of `size` columns, referenced as `dense.<name>`.

    With `embed_dim` (`embed: {dim: D}` in the spec) the value in the model is
    a field stack [B, size, D] instead: column i times its own learned
    vector v_i, plus a learned b_i with `embed_bias`.
    """

    name: str
    size: int
    loc: Location
    embed_dim: int | None = None
    embed_bias: bool = False
    transform: DenseTransform | None = (
        None  # how csv / parquet fields (or earlier rows) become its values (runtime.features)
    )

    @property
    def is_stack(self) -> bool:
        return self.embed_dim is not None


@dataclass(frozen=True, slots=True)
class SparseFeature:
    """A bag of ids looked up in `table`, referenced as `sparse.<name>`.

    `ids_per_sample` is the exact count when `fixed_ids` is true, otherwise
    the maximum (samples hold 0..ids_per_sample ids). `hashed` means raw ids
    are hashed into the table's rows before lookup.

    A sequence feature (`pooling: none` in the spec) has a `max_length`: its
    value in the model is a sequence [B, L <= max_length, dim] with its
    lengths, longer ones cut to their `keep` side (`end`: the most recent).

    `column` is the data column the feature reads when not its own name:
    another sparse feature's ids (fanned out by the readers), or, with
    `boundaries`, column `column_index` of a dense feature, bucketized into
    one id per sample. A `position_weighted` feature scales the j-th id of a
    bag by a learned weight j before pooling (its table is looked up as rows).
    """

    name: str
    table: str
    ids_per_sample: int
    fixed_ids: bool
    weighted: bool
    hashed: bool
    loc: Location
    max_length: int | None = None  # set for sequence features only
    keep: Keep = "end"
    column: str | None = None  # None: the feature's own name
    column_index: int = 0  # the dense column a bucketized feature reads
    boundaries: tuple[float, ...] = ()  # set for bucketized features only
    position_weighted: bool = False
    transform: SparseTransform | None = None  # a learned vocabulary, cross, quantiles or history (runtime.features)

    @property
    def is_sequence(self) -> bool:
        return self.max_length is not None


@dataclass(frozen=True, slots=True)
class TimestampsFeature:
    """Per-position int64 times of the sequence feature `sequence`, referenced as `timestamps.<name>`.

    In a batch it is a key of the sparse KeyedJaggedTensor with the
    sequence's lengths; the model cuts it as it cuts the sequence.
    """

    name: str
    sequence: str
    loc: Location


@dataclass(frozen=True, slots=True)
class Table:
    """An embedding table and the sparse features that look it up."""

    name: str
    num_embeddings: int
    dim: int
    pooling: Pooling
    features: tuple[str, ...]
    init_min: float
    init_max: float
    optimizer: Optimizer  # its own, or the training section's sparse optimizer (resolved in the IR)
    loc: Location


@dataclass(frozen=True, slots=True)
class Input:
    """One resolved input of a block or head.

    kind `dense` / `sparse` name a feature; kind `block` names a block and,
    for blocks with several outputs (moe), the `port` (a task name); kind
    `timestamps` names a timestamps feature (a side input of `hstu`).
    A vector is [B, width]; a sequence has a `length` and is
    [B, <= length, width] with its lengths; a field stack has `fields` and
    is [B, fields, width].
    """

    kind: Literal["dense", "sparse", "block", "timestamps"]
    name: str
    width: int
    port: str | None = None
    length: int | None = None  # set for sequences only
    fields: int | None = None  # set for field stacks only

    @property
    def is_sequence(self) -> bool:
        return self.length is not None

    @property
    def is_stack(self) -> bool:
        return self.fields is not None

    def ref(self) -> str:
        """The reference as written in a spec (`dense.x`, `sparse.y`, `b`, `b.task`)."""
        if self.kind == "block":
            return self.name if self.port is None else f"{self.name}.{self.port}"
        return f"{self.kind}.{self.name}"


@dataclass(frozen=True, slots=True)
class Mlp:
    """Linear layers; `norm`, `dropout` and `residual` decorate the layers followed by an activation."""

    layers: tuple[int, ...]
    activation: str
    final_activation: str  # "none" for a linear (logit) output
    norm: Literal["none", "layer", "batch"] = "none"
    dropout: float = 0.0
    residual: bool = False

    @property
    def decorated(self) -> bool:
        return self.norm != "none" or self.dropout > 0 or self.residual


@dataclass(frozen=True, slots=True)
class Dot:
    """DLRM pairwise interaction over all inputs (equal widths)."""


@dataclass(frozen=True, slots=True)
class Concat:
    pass


@dataclass(frozen=True, slots=True)
class CrossNet:
    num_layers: int
    low_rank: int | None


@dataclass(frozen=True, slots=True)
class Fm:
    """Factorization machine second-order term over the inputs (equal widths).

    `output` "sum": the scalar term; "vector": its D-wide vector before the sum over d (TorchEasyRec's DeepFM).
    """

    output: Literal["sum", "vector"] = "sum"


@dataclass(frozen=True, slots=True)
class DotProduct:
    """Row-wise dot product of exactly two inputs of equal width (two-tower score)."""


@dataclass(frozen=True, slots=True)
class Sum:
    """Elementwise sum of inputs of equal width."""


@dataclass(frozen=True, slots=True)
class Moe:
    """Multi-gate mixture of experts; one output port per task.

    With `task_experts` > 0 or `levels` > 1 it is PLE (progressive layered
    extraction): `num_experts` shared experts and `task_experts` experts per
    task in each of `levels` extraction layers, each task's gate over its own
    and the shared experts.
    """

    num_experts: int
    expert_layers: tuple[int, ...]
    tasks: tuple[str, ...]
    activation: str
    task_experts: int = 0
    levels: int = 1
    # PLE with layers of different sizes: (shared experts, task experts, expert layers) of each level; () when
    # every level is (num_experts, task_experts, expert_layers).
    per_level: tuple[tuple[int, int, tuple[int, ...]], ...] = ()

    @property
    def is_ple(self) -> bool:
        return self.task_experts > 0 or self.levels > 1


@dataclass(frozen=True, slots=True)
class Product:
    """Elementwise product of inputs of equal width (gating, ESMM's p(ctr) x p(cvr))."""


@dataclass(frozen=True, slots=True)
class Activation:
    """An activation function applied elementwise to the concatenated inputs."""

    fn: str


@dataclass(frozen=True, slots=True)
class SequencePool:
    """One sequence reduced to a vector over its real positions."""

    mode: Literal["sum", "mean", "max", "first", "last"]


@dataclass(frozen=True, slots=True)
class TargetAttention:
    """DIN's attention of the vector `query` over the sequence input (same width); with several sequence
    inputs (fields of one history, joined position by position) the query is `query` and `query_fields` joined."""

    query: Input
    hidden: tuple[int, ...]
    activation: str
    normalize: Literal["none", "softmax"] = "none"
    # Several sequence fields joined position by position: the query vectors after `query`, one per field.
    query_fields: tuple[Input, ...] = ()


@dataclass(frozen=True, slots=True)
class Transformer:
    """Encoder layers over the sequence input, after the `prepend` vectors placed before it."""

    num_layers: int
    num_heads: int
    ffn_dim: int
    norm: Literal["pre", "post", "sasrec"]
    causal: bool
    positions: Literal["learned", "concat", "none"]
    activation: Literal["relu", "gelu", "leaky_relu"]
    prepend: tuple[Input, ...]
    norm_affine: bool = True
    scale_input: bool = False
    dropout: float = 0.0
    input_dropout: float = 0.0
    position_dim: int = 0  # positions: concat, the width of the concatenated positions


@dataclass(frozen=True, slots=True)
class Hstu:
    """HSTU layers over the sequence input, with the times of its positions."""

    num_layers: int
    num_heads: int
    attention_dim: int
    linear_dim: int
    num_buckets: int
    timestamps: Input
    dropout: float = 0.0
    scale_input: bool = False
    positions: Literal["learned", "none"] = "none"
    input_dropout: float = 0.0


@dataclass(frozen=True, slots=True)
class AuxLoss:
    """DIEN's auxiliary next-behaviour loss on a `gru` block: `weight` times the term joins the training loss."""

    weight: float  # >= 0; 0 builds no auxiliary network


@dataclass(frozen=True, slots=True)
class Gru:
    """A GRU over the sequence input, its state at every position; with a `query`, DIEN's AUGRU."""

    hidden_size: int
    num_layers: int
    query: Input | None  # the target vector whose attention scores gate the updates
    attention: Literal["bilinear", "dot"]
    attention_softmax: bool
    aux_loss: AuxLoss | None = None  # a sparse sequence feature's extractor: its next-behaviour loss


@dataclass(frozen=True, slots=True)
class Stack:
    """Vectors and field stacks of one width D stacked along a field axis: [B, N, D]."""


@dataclass(frozen=True, slots=True)
class Flatten:
    """A field stack [B, N, D] as the vector [B, N * D], field after field."""


@dataclass(frozen=True, slots=True)
class SelfAttention:
    """AutoInt's interacting layers: multi-head self-attention over the fields of a stack."""

    num_layers: int
    num_heads: int
    attention_dim: int  # per head; the output fields are num_heads * attention_dim wide
    residual: bool
    residual_projection: bool = True  # False: the residual adds the input itself (W_Res = I)


@dataclass(frozen=True, slots=True)
class Cin:
    """xDeepFM's compressed interaction network over a stack; its output is a vector."""

    layer_sizes: tuple[int, ...]
    split_half: bool
    bias: bool = False


@dataclass(frozen=True, slots=True)
class Wukong:
    """Wukong layers (factorization-machine block + linear compress block) over a stack."""

    num_layers: int
    num_fmb: int
    num_lcb: int
    rank: int
    fmb_layers: tuple[int, ...]
    activation: str


@dataclass(frozen=True, slots=True)
class MaskNet:
    """MaskNet's instance-guided mask blocks over a stack, serial or parallel; its output is a vector."""

    mode: Literal["serial", "parallel"]
    block_sizes: tuple[int, ...]
    reduction_ratio: float
    layer_norm: bool
    emb_layer_norm: bool
    layers: tuple[int, ...]
    emb_norm_scope: Literal["field", "whole"] = "field"


BlockOp = Union[
    Mlp,
    Dot,
    Concat,
    CrossNet,
    Fm,
    DotProduct,
    Sum,
    Moe,
    SequencePool,
    TargetAttention,
    Transformer,
    Hstu,
    Stack,
    Flatten,
    SelfAttention,
    Cin,
    Wukong,
    MaskNet,
    Product,
    Activation,
    Gru,
]
SEQUENCE_OPS = (SequencePool, TargetAttention, Transformer, Hstu, Gru)  # the blocks that read a sequence
STACK_OPS = (Flatten, SelfAttention, Cin, Wukong, MaskNet)  # the blocks that read one field stack


@dataclass(frozen=True, slots=True)
class Block:
    """A node of the dense DAG. `width` is the output width (per port for moe).

    A block whose output is a sequence (transformer, hstu) has its `length`,
    the longest sequence it gives; one whose output is a field stack (stack,
    self_attention, wukong) has its `fields`, [B, fields, width].
    """

    name: str
    op: BlockOp
    inputs: tuple[Input, ...]
    width: int
    loc: Location
    length: int | None = None
    fields: int | None = None

    @property
    def type(self) -> str:
        return BLOCK_TYPE_NAMES[type(self.op)]


BLOCK_TYPE_NAMES: dict[type, str] = {
    Mlp: "mlp",
    Dot: "dot",
    Concat: "concat",
    CrossNet: "crossnet",
    Fm: "fm",
    DotProduct: "dot_product",
    Sum: "sum",
    Moe: "moe",
    SequencePool: "sequence_pool",
    TargetAttention: "target_attention",
    Transformer: "transformer",
    Hstu: "hstu",
    Stack: "stack",
    Flatten: "flatten",
    SelfAttention: "self_attention",
    Cin: "cin",
    Wukong: "wukong",
    MaskNet: "mask_block",
    Product: "product",
    Activation: "activation",
    Gru: "gru",
}


@dataclass(frozen=True, slots=True)
class Retrieval:
    """A sampled-softmax retrieval head: where its query and item vectors come from, and its negatives.

    The item vector is a block (the item tower, reading `item_feature` and,
    with `attributes`, those features: the item catalogue keeps each item's
    attribute ids, runtime.retrieval.item_attributes) or the sparse feature
    itself (its table row); the positives
    are the ids of `item_feature`. With `next_item` the query is a sequence and
    position t predicts the item at t + 1 of `item_feature`'s sequence.
    """

    item: Input  # block (item tower) or sparse feature, vector [B, D] (a sequence for next_item)
    item_feature: str  # the sparse feature whose ids are the positives
    item_table: str  # that feature's table: uniform negatives and the catalogue come from it
    in_batch: bool
    uniform: int  # uniform negatives per step; 0 for none
    logq: bool
    temperature: float
    normalize: bool
    ks: tuple[int, ...]  # the k of the metrics
    next_item: bool  # the query is a sequence and each position predicts the next item
    per_query: bool = False  # each query draws its own `uniform` negatives (else one draw a step)
    mask_seen: bool = False  # next_item: a held-out row's history items are no candidates in the metrics
    attributes: tuple[str, ...] = ()  # item_attributes: the sparse features the item tower reads beside the id
    on_conflict: AttributeConflict = "last"  # item_attributes: a row contradicting an earlier one wins or stops


@dataclass(frozen=True, slots=True)
class Head:
    """A prediction head: the loss on one block output against one label column.

    A `sampled_softmax` head has `retrieval`; its `input` is the query and its
    `label` the item feature's name (it reads no label column).
    """

    name: str
    input: Input
    loss: LossType
    label: str
    weight: float
    num_classes: int  # 1 for bce, mse and sampled_softmax
    metrics: tuple[str, ...]
    loc: Location
    retrieval: Retrieval | None = None
    output: Literal["logit", "probability"] = "logit"  # what a bce head's input holds


@dataclass(frozen=True, slots=True)
class LrSchedule:
    """The learning-rate factor per step, for every optimizer (runtime.config.lr_schedule has the
    formulas); parameters the type does not read are None. `loc` is None for the default."""

    type: LrScheduleType = "constant"
    warmup_steps: int = 0
    start_factor: float = 0.0
    step_size: int | None = None
    gamma: float | None = None
    total_steps: int | None = None
    final_factor: float | None = None
    loc: Location | None = None


@dataclass(frozen=True, slots=True)
class EarlyStopping:
    """`training.early_stopping`: the eval metric whose best pass is kept (`metric` or
    `head.metric`, checked against the heads) and the passes without a gain before stopping."""

    metric: str
    patience: int | None
    loc: Location


@dataclass(frozen=True, slots=True)
class LrPlateau:
    """`training.lr_plateau`: the eval metric (checked against the heads) whose plateaus reduce
    every learning rate, as runtime.train.lr_plateau decides; `mode` None is the metric's own."""

    metric: str
    mode: str | None
    factor: float
    patience: int
    min_factor: float
    threshold: float
    loc: Location


@dataclass(frozen=True, slots=True)
class Training:
    batch_size: int  # global: each of N ranks gets batch_size / N
    seed: int
    steps: int
    dense_optimizer: Optimizer
    sparse_optimizer: Optimizer
    loc: Location
    lr_schedule: LrSchedule = LrSchedule()
    early_stopping: EarlyStopping | None = None
    lr_plateau: LrPlateau | None = None
    precision: str = "fp32"  # the dense layers' compute: fp32 or bf16 (runtime.train.precision)
    precision_loc: Location | None = None


@dataclass(frozen=True, slots=True)
class Constraint:
    """Planner restrictions for one table (empty tuples mean no restriction)."""

    table: str
    sharding_types: tuple[ShardingType, ...]
    compute_kernels: tuple[ComputeKernel, ...]
    ranks: tuple[int, ...]
    loc: Location


@dataclass(frozen=True, slots=True)
class Sharding:
    world_size: int
    device: Device
    ranks_per_host: int | None  # None: all ranks on one host
    memory_per_rank: int | None  # bytes; None: the topology's default for the device
    constraints: tuple[Constraint, ...]
    loc: Location


@dataclass(frozen=True, slots=True)
class Data:
    """Where training data comes from; `columns` maps a reader column to a feature or label."""

    reader: Literal["synthetic", "criteo", "movielens", "csv", "parquet", "prepared"]
    path: str | None
    columns: tuple[tuple[str, str], ...]
    loc: Location


@dataclass(frozen=True, slots=True)
class ModelIR:
    """The whole model. `blocks` are in a topological order of the DAG."""

    version: int
    name: str
    source: str  # the spec path as given
    source_sha256: str
    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    tables: tuple[Table, ...]
    blocks: tuple[Block, ...]
    heads: tuple[Head, ...]
    training: Training
    sharding: Sharding
    data: Data | None
    loc: Location
    timestamps: tuple[TimestampsFeature, ...] = ()

    def table(self, name: str) -> Table:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    def feature(self, name: str) -> SparseFeature:
        for feature in self.sparse:
            if feature.name == name:
                return feature
        raise KeyError(name)

    def sequence_tables(self) -> tuple[Table, ...]:
        """The tables that serve a sequence or a position-weighted feature: all their features are
        looked up as rows."""
        sequences = {feature.table for feature in self.sparse if feature.is_sequence or feature.position_weighted}
        return tuple(table for table in self.tables if table.name in sequences)

    def block(self, name: str) -> Block:
        for block in self.blocks:
            if block.name == name:
                return block
        raise KeyError(name)
