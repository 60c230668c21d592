"""`reccompile schema`: print the JSON Schema of the spec language (version 1)."""

from __future__ import annotations

import argparse
import json

from compiler.spec.validate import load_schema


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    del args
    print(json.dumps(load_schema(), indent=2, ensure_ascii=False))
    return 0
