"""reccompile runtime: the library that generated modules import.

It never imports the compiler.
"""
