"""Code generation: a lowered model -> the text of an importable Python module."""
