"""Lowering: ModelIR + ShardingPlan -> the fx graph of the distributed program.

The passes, in the order compiler/pipeline.py runs them:

    lower.py             the graph and the submodule declarations
      calls.py           the runtime call each IR value lowers to (the compiler-runtime contract)
      sequences.py       the sequence part: sequence groups, values and blocks
      one_position.py    transformers read at one position keep only that position's work
    shapes.py            meta tensors through the graph: widths checked at compile time
      sequence_shapes.py the shape check's stand-ins for sequences
    dense_memory.py      the replicated blocks must fit beside each rank's table shards
    retrieval_graphs.py  a retrieval model's query and item graphs, cut from the final graph
    split.py             the graph cut into the pipeline's two stages
    instantiate.py       the declarations built in memory (tests, `reccompile graph`)
    graph_text.py        the canonical text of the graph (goldens, `reccompile graph`)
    types.py             the data the passes hand each other
"""
