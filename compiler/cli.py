"""The `reccompile` command line.

`reccompile SPEC` compiles a spec; `reccompile COMMAND ...` runs one of the
commands below, each implemented by its own module in `compiler.commands`
(`add_arguments(parser)` and `run(args) -> exit status`). Exit status: 0 ok,
1 the input has errors, 2 bad command-line use (a first word that is neither
a command nor a file among them).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from typing import Sequence

from compiler import __version__
from runtime.cpu import openmp
from runtime.process.lifetime import skip_exit_collection

# command name -> (module in compiler.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "compile": ("compile", "check, plan and write the generated module (the default command)"),
    "check": ("check", "check specs and print their diagnostics"),
    "show": ("show", "print the fully resolved spec, defaults included"),
    "schema": ("schema", "print the JSON Schema of the spec language"),
    "plan": ("plan", "print the sharding plan of a spec"),
    "graph": ("graph", "print the canonical fx graph of a spec"),
    "train": ("train", "train a spec (torchrun workers for --nproc > 1)"),
    "export": ("export", "write a trained checkpoint as a serving directory (quantized tables, .pt2)"),
    "predict": ("predict", "score samples with an exported model into a CSV file"),
    "retrieve": ("retrieve", "top-k items per request from an exported retrieval model into a CSV file"),
    "serve": ("serve", "answer Open Inference Protocol (KServe v2) requests over HTTP with exported models"),
    "data": ("data", "prepare training data once into Parquet row groups, or split MovieLens positives by time"),
    "info": ("info", "print the CPU, its vector features, the native kernels and the kernel choices made"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that command's module is imported (torch loads lazily)."""
    parser = argparse.ArgumentParser(
        prog="reccompile",
        description="Compile a YAML recommender-model spec into a sharded PyTorch program.",
        epilog="`reccompile SPEC` is short for `reccompile compile SPEC`.",
    )
    parser.add_argument("--version", action="version", version=f"reccompile {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            module = importlib.import_module(f"compiler.commands.{module_name}")
            module.add_arguments(command_parser)
            command_parser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    skip_exit_collection()
    try:
        status = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed stdout shows here, not in the interpreter's flush at exit
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:  # train and data prepare say more; every command writes its output whole or not at all
        print("interrupted: nothing was written", file=sys.stderr)
        return 128 + signal.SIGINT
    return status


def _stdout_closed() -> int:
    """The reader of stdout is gone (`reccompile schema | head`): stop without a traceback and
    exit as a command killed by SIGPIPE does, 141, which `set -o pipefail` reports."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere at exit
    return 128 + signal.SIGPIPE


def _run(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        if not os.path.exists(argv[0]):
            print(f"error: {_neither(argv[0])}", file=sys.stderr)
            return 2
        argv.insert(0, "compile")
    if argv and argv[0] == "train":
        openmp.training_environment(os.environ)  # before the command's module loads torch
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


def _neither(word: str) -> str:
    """What is wrong with a first word that names no command and no file: a mistyped command, most often."""
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{word!r} is neither a command{hint} nor a spec file"


if __name__ == "__main__":
    sys.exit(main())
