"""Lowering: ModelIR + ShardingPlan -> the fx graph of the distributed program.

    lower.py        the graph and the submodule declarations (calls.py: the runtime call per IR value)
    shapes.py       meta tensors through the graph: widths checked at compile time
    split.py        the graph cut into the pipeline's two stages
    instantiate.py  the declarations built in memory (tests, `reccompile graph`)
    graph_text.py   the canonical text of the graph (goldens, `reccompile graph`)
    types.py        the data the passes hand each other
"""
