"""The manifest of a prepared directory: its rows, row groups, columns and files, checked on open.

`DIR/manifest.json` is written last, by rename, when every part is complete:
a directory without one is a prepare still running or stopped, never data
to train on. It holds

    rows, row_group_rows        the rows in all; the rows of every row group but a part's last
    spec_sha256                 the sha256 of `columns`' specs (runtime.data.prepared.schema)
    columns                     name -> {"spec": what the spec made of it, "stats": its statistics}
    files                       in row order: name, rows, rows of each row group, bytes, sha256
    source                      the reader, path, input files (size, mtime), lines read and bad rows
                                dropped (the first few named)

`check_inputs` compares the columns a spec needs with the manifest's before
any row is read: a missing column or one prepared for another table size,
sequence length or loss is refused by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.data import ModelInputs
from runtime.data.errors import DataError
from runtime.data.prepared.schema import column_specs
from runtime.storage.manifest import file_sha256

MANIFEST = "manifest.json"
FORMAT = "reccompile-prepared"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class PartFile:
    """One Parquet file of a prepared directory."""

    name: str
    rows: int
    row_groups: tuple[int, ...]  # rows of each row group, in order
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rows": self.rows,
            "row_groups": list(self.row_groups),
            "bytes": self.bytes,
            "sha256": self.sha256,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> PartFile:
        return PartFile(data["name"], data["rows"], tuple(data["row_groups"]), data["bytes"], data["sha256"])


@dataclass(frozen=True)
class Manifest:
    """A finished prepared directory, as its manifest describes it."""

    directory: Path
    rows: int
    row_group_rows: int
    spec_sha256: str
    columns: dict[str, dict[str, Any]]
    files: tuple[PartFile, ...]
    source: dict[str, Any]

    def groups(self) -> list[tuple[int, int, int]]:
        """(file index, row group within the file, rows) of every row group, in row order."""
        return [(f, g, rows) for f, part in enumerate(self.files) for g, rows in enumerate(part.row_groups)]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "rows": self.rows,
            "row_group_rows": self.row_group_rows,
            "spec_sha256": self.spec_sha256,
            "columns": self.columns,
            "files": [part.to_json() for part in self.files],
            "source": self.source,
        }


def write_manifest(manifest: Manifest) -> Path:
    """Write DIR/manifest.json whole or not at all: the step that makes a prepare finished."""
    path = manifest.directory / MANIFEST
    write_json_atomically(path, manifest.to_json())
    return path


def write_json_atomically(path: Path, data: Any) -> None:
    """`path` replaced by `data` as JSON in one rename, synced first so a crash leaves old or new."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as stream:
        json.dump(data, stream, indent=1)
        stream.flush()
        os.fsync(stream.fileno())
    temporary.replace(path)


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest of a finished prepared directory; DataError saying why `directory` is not one."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"prepared data {directory}: no such directory")
    path = root / MANIFEST
    if not path.is_file():
        raise DataError(
            f"prepared data {directory}: no {MANIFEST}, so not a finished prepare (one still running or "
            f"stopped); run `reccompile data prepare` with -o {directory} again to finish it"
        )
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
            raise DataError(
                f"{path}: format {data.get('format')!r} version {data.get('format_version')!r}, "
                f"expected {FORMAT!r} version {FORMAT_VERSION}"
            )
        manifest = Manifest(
            root,
            int(data["rows"]),
            int(data["row_group_rows"]),
            str(data["spec_sha256"]),
            dict(data["columns"]),
            tuple(PartFile.from_json(part) for part in data["files"]),
            dict(data["source"]),
        )
        _check_counts(manifest)
        return manifest
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise DataError(f"{path}: not a readable manifest ({type(error).__name__}: {error})") from None


def _check_counts(manifest: Manifest) -> None:
    """The manifest's numbers agree with each other (one edited by hand may not): ValueError if not."""
    if manifest.row_group_rows < 1:
        raise ValueError(f"row_group_rows is {manifest.row_group_rows}, must be at least 1")
    for part in manifest.files:
        if not isinstance(part.name, str) or Path(part.name).name != part.name or part.name in ("", ".", ".."):
            raise ValueError(f"part name {part.name!r} is not a file of the directory")
    groups = [rows for part in manifest.files for rows in part.row_groups]
    if any(not 1 <= rows <= manifest.row_group_rows for rows in groups):
        raise ValueError(f"a row group's rows are outside 1 to row_group_rows {manifest.row_group_rows}")
    if sum(groups) != manifest.rows or any(part.rows != sum(part.row_groups) for part in manifest.files):
        raise ValueError(f"rows {manifest.rows} are not the sum of the row groups' ({sum(groups)})")


def check_files(manifest: Manifest, hashes: bool = False) -> None:
    """Every part is there with its size (and, with `hashes`, its sha256); DataError naming the first not."""
    for part in manifest.files:
        path = manifest.directory / part.name
        if not path.is_file():
            raise DataError(f"prepared data {manifest.directory}: part {part.name} is missing")
        size = path.stat().st_size
        if size != part.bytes:
            raise DataError(
                f"prepared data {manifest.directory}: part {part.name} has {size} bytes, the manifest says {part.bytes}"
            )
        if hashes and file_sha256(path) != part.sha256:
            raise DataError(f"prepared data {manifest.directory}: part {part.name} does not match its sha256")


def check_inputs(manifest: Manifest, inputs: ModelInputs) -> dict[str, dict[str, Any]]:
    """The column specs `inputs` reads, each checked against the manifest's; DataError naming the column.

    Columns the spec does not read are left alone (they are never decoded)."""
    needed = column_specs(inputs)
    where = f"prepared data {manifest.directory}"
    for name, spec in needed.items():
        entry = manifest.columns.get(name)
        if entry is None:
            have = ", ".join(manifest.columns)
            raise DataError(
                f"{where}: no column {name!r}, which the spec's {_describe(name, spec)} reads (it has {have}); "
                "prepare the data again for this spec"
            )
        prepared = entry["spec"]
        for field in sorted(spec.keys() | prepared.keys()):
            if spec.get(field) != prepared.get(field):
                raise DataError(
                    f"{where}: column {name!r} was prepared with {field} {prepared.get(field)!r} but the spec's "
                    f"{_describe(name, spec)} has {field} {spec.get(field)!r}; prepare the data again for this spec"
                )
    return needed


def _describe(name: str, spec: dict[str, Any]) -> str:
    key = name.partition(".")[2]
    kind = spec["kind"]
    if kind == "label":
        return f"head label {key!r}"
    if kind == "weights":
        return f"weights of {spec['of']!r}"
    return f"{kind} feature {key!r}"
