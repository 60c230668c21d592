"""The raw files a prepare reads, each recorded by size and modification time.

    recorded = input_stamps(input_files(DataChoice("criteo", "days/"), None))
    input_change(recorded, input_stamps(input_files(...)))  # None, or 'days/day_3 is new'

A prepare records its inputs in the journal and the manifest
(runtime.data.prepared.prepare); run again on the same directory, it
compares them with the files as they are now, so a finished prepare is not
reused, nor a stopped one continued, for inputs that changed since. Size and
mtime rather than a digest: a digest reads every input again on each
re-run (a Criteo day is tens of GB, minutes of reading, only to say "nothing
to do"), while a stat is instant, and any write to a file moves its mtime.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runtime.data.files.text_lines import data_files
from runtime.data.movielens.reader import movies_file, ratings_file
from runtime.data.sources import DataChoice


def input_files(choice: DataChoice, training: str | None) -> list[Path]:
    """The files `choice` reads: its data files, or a MovieLens ratings file and its movies file
    (with those of the `training` ratings, whose vocabulary and histories evaluation data takes);
    csv or parquet evaluation data with the `training` files its learned features come from."""
    if choice.reader != "movielens":
        return data_files(choice.path or "") + ([] if training is None else data_files(training))
    files = []
    for path in (choice.path or "", *([] if training is None else [training])):
        ratings, layout = ratings_file(path)
        movies = movies_file(ratings, layout)
        files += [ratings, *([movies] if movies.is_file() else [])]
    return files


def input_stamps(files: list[Path]) -> list[dict[str, Any]]:
    """Each file's path, size and modification time (ns), as the journal and the manifest keep them."""
    stamps = []
    for file in files:
        stat = file.stat()
        stamps.append({"path": str(file), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return stamps


def input_change(recorded: list[dict[str, Any]] | None, current: list[dict[str, Any]]) -> str | None:
    """How the inputs differ from those `recorded` (None: they do not), for a message."""
    if recorded is None:
        return "it records no sizes and times of its input files (an earlier reccompile wrote it)"
    then = {stamp["path"]: stamp for stamp in recorded}
    now = {stamp["path"]: stamp for stamp in current}
    for path, old in then.items():
        new = now.get(path)
        if new is None:
            return f"{path} is gone"
        if (new["bytes"], new["mtime_ns"]) != (old["bytes"], old["mtime_ns"]):
            return f"{path} has changed since (then {_state(old)}; now {_state(new)})"
    added = [path for path in now if path not in then]
    return None if not added else f"{added[0]} is new"


def _state(stamp: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(stamp["mtime_ns"] / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp['bytes']:,} bytes, modified {when}"
