"""reccompile: the spec compiler (YAML spec -> IR -> plan -> fx graph -> Python module)."""

__version__ = "0.1.0"
