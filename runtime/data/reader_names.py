"""The readers `--data READER:PATH` names, one list for its parser (runtime.data.sources), its
messages and every help text that lists them. Torch-free: a parser's help imports no reader."""

from __future__ import annotations

from typing import Sequence

READERS = ("synthetic", "criteo", "movielens", "csv", "parquet", "prepared")
# Those read line by line from files: prepared data is read by rank, synthetic data from no file.
FILE_READERS = ("criteo", "movielens", "csv", "parquet")


def data_forms(readers: Sequence[str] = READERS, *, bare: str | None = None) -> str:
    """How `--data` names `readers`, for help and messages, with `bare` (a form without a reader) last:

    >>> data_forms(bare="PATH")
    'synthetic, criteo:PATH, movielens:PATH, csv:PATH, parquet:PATH, prepared:DIR or PATH'
    """
    forms = [name if name == "synthetic" else f"{name}:{'DIR' if name == 'prepared' else 'PATH'}" for name in readers]
    forms += [] if bare is None else [bare]
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"
