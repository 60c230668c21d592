"""The serving compiler: `reccompile export`, a trained checkpoint -> a serving directory.

lower.py   ModelIR -> the single-process serving graph (one quantized collection)
emit.py    the serving graph -> the inference module's text
export.py  the whole command: precisions, weights, `.pt2`, manifest
"""
