"""One module per `reccompile` command: `add_arguments(parser)` and `run(args) -> int`."""
