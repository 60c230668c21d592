"""The learned feature state a training run applies: the resumed one, the prepared one, or learned now.

    inputs = learned_inputs(inputs, choice, module_file=..., resumed=..., rank=..., process_group=...)

In this order (runtime.features: a spec whose features learn from the data):

    --resume (or a restart)   the checkpoint's features.json: the rows of the tables mean its ids,
                              whatever data the run now reads; never relearned
    prepared:DIR              DIR/features.json, held to the sha256 its manifest records
    csv: / parquet:           learned now from the training files, on rank 0 only (one pass, a
                              progress bar on a terminal), its bytes broadcast to the other ranks,
                              so every rank applies the same state
    synthetic                 nothing to learn (the batches are ids already)

The state is written beside the generated module (`<module>.features.json`),
where every checkpoint takes it from, and the evaluation data of the run is
read with the same state.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch.distributed as dist

from runtime.config.data import ModelInputs
from runtime.data.errors import DataError
from runtime.data.prepared.manifest import read_manifest
from runtime.data.sources import DataChoice, open_reader
from runtime.data.tables.learn import learn_features, learned_configs
from runtime.features.state import FILE, FeatureStateError, parse_features, read_features
from runtime.reporting import console

SUFFIX = ".features.json"


def learned_inputs(
    inputs: ModelInputs,
    choice: DataChoice,
    *,
    module_file: str | Path,
    resumed: Path | None,
    rank: int,
    process_group: dist.ProcessGroup | None,
) -> ModelInputs:
    """`inputs` with the learned state the run applies (see the module docstring); as they are without
    transforms to learn."""
    configs = learned_configs(inputs)
    if not configs:
        return inputs
    beside = Path(module_file).with_suffix(SUFFIX)
    try:
        if resumed is not None:
            data = resumed.read_bytes()
            learned = parse_features(data, configs, str(resumed))
        elif choice.reader == "prepared":
            learned = prepared_features(Path(choice.path or ""), configs)
            data = learned.to_bytes()
        elif choice.reader in ("csv", "parquet"):
            data = _learned_on_rank_0(inputs, choice, rank, process_group)
            learned = parse_features(data, configs, f"the features learned from {choice}")
        elif choice.reader == "synthetic":
            return inputs
        else:
            raise DataError(
                f"features {', '.join(map(repr, configs))} are learned from csv or parquet columns; "
                f"{choice} has columns of its own"
            )
    except FeatureStateError as error:
        raise DataError(str(error)) from None
    if rank == 0:
        partial = beside.with_name(f".{beside.name}.partial")
        partial.write_bytes(data)
        partial.replace(beside)
    return dataclasses.replace(inputs, learned=learned)


def prepared_features(directory: Path, configs: dict) -> object:
    """The state prepared data was made with (DIR/features.json, checked against its manifest's sha256)."""
    manifest = read_manifest(directory)
    entry = manifest.source.get("features")
    if entry is None:
        raise DataError(
            f"prepared data {directory}: prepared without learned features (no {FILE}); prepare it again for this spec"
        )
    return read_features(directory / entry["name"], configs, entry["sha256"])


def _learned_on_rank_0(inputs: ModelInputs, choice: DataChoice, rank: int, group: dist.ProcessGroup | None) -> bytes:
    """features.json's bytes, learned from the training files by rank 0 and sent to every rank."""
    data = b""
    if rank == 0:
        learned = learn_features(open_reader(inputs, choice), warn=lambda line: console.say(line, sys.stderr))
        console.say(f"learned {len(learned.features)} feature transforms from {choice} (runtime.features)")
        data = learned.to_bytes()
    if group is not None and dist.get_world_size(group) > 1:
        box = [data]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        data = box[0]
    return data
