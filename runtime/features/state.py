"""`LearnedFeatures`: every learned state of a model, and its file `features.json`.

    {"format": "reccompile-features", "version": 2,
     "features": {"user": {"kind": "vocabulary", "version": 1,
                           "config": {"min_count": 1, "max_size": 10000, "oov_buckets": 1},
                           "state": {"seen": 943, "oov_buckets": 1, "values": ["u405", ...]}}, ...}}

The file is written once (atomically) and read back byte for byte wherever
it travels: beside prepared data (its sha256 in the manifest), beside the
generated module while training, in checkpoints and exports. `read_features`
holds a state to the spec: a feature learned with another config or another
transform version is an error that says to learn again, never a silent
relearning.

A long list a state holds that an earlier feature's state holds too (the
training rows' keys, counts and times of the dense histories of one `by` and
`time`) is written once: a later one is `{"$same_as": [feature, field]}`
(version 2; a version 1 file, without them, still loads).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from runtime.config.transforms import config_json
from runtime.features.registry import transform

FILE = "features.json"
FORMAT = "reccompile-features"
VERSION = 2
READABLE = (1, 2)  # version 1: no shared lists
SAME_AS = "$same_as"
_SHARED_LENGTH = 100  # lists at least this long are written once


class FeatureStateError(ValueError):
    """A features.json that is unreadable or does not fit the spec; the message names the file and the feature."""


@dataclass(frozen=True)
class Learned:
    """One feature's learned state."""

    kind: str
    config: Any  # runtime.config.transforms
    state: Any  # the transform's own state object


@dataclass(frozen=True)
class LearnedFeatures:
    """The learned states of a model's features, by feature name; `source` names the file read."""

    features: Mapping[str, Learned]
    source: str = ""

    def get(self, name: str) -> Learned:
        return self.features[name]

    def describe(self) -> list[str]:
        """One line per feature: what was learned (sizes, not values)."""
        return [
            f"feature {name}: {transform(learned.kind).describe(learned.config, learned.state)}"
            for name, learned in self.features.items()
        ]

    def to_bytes(self) -> bytes:
        seen: dict[str, list[str]] = {}
        body = {
            name: {
                "kind": learned.kind,
                "version": transform(learned.kind).version,
                "config": config_json(learned.config),
                "state": _share(transform(learned.kind).dump(learned.state), name, seen),
            }
            for name, learned in self.features.items()
        }
        document = {"format": FORMAT, "version": VERSION, "features": body}
        return (json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n").encode()

    def write(self, path: str | Path) -> str:
        """Write the file atomically; its sha256."""
        data = self.to_bytes()
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes(data)
        os.replace(partial, target)
        return hashlib.sha256(data).hexdigest()


def _share(state: dict[str, Any], name: str, seen: dict[str, list[str]]) -> dict[str, Any]:
    """`state` with each long list an earlier feature's state holds replaced by a reference to it; `seen`
    (the JSON of each long list so far -> [feature, field]) grows with this state's own."""
    out = {}
    for field, value in state.items():
        if isinstance(value, list) and len(value) >= _SHARED_LENGTH:
            text = json.dumps(value, separators=(",", ":"))
            if text in seen:
                out[field] = {SAME_AS: seen[text]}
                continue
            seen[text] = [name, field]
        out[field] = value
    return out


def _resolve(state: Any, stored: Mapping[str, Any], file: str, name: str) -> Any:
    """A stored state with its references (`_share`) replaced by the lists they name."""
    if not isinstance(state, dict):
        return state
    out = {}
    for field, value in state.items():
        if isinstance(value, dict) and set(value) == {SAME_AS}:
            target = value[SAME_AS]
            try:
                value = stored[target[0]]["state"][target[1]]
            except (KeyError, IndexError, TypeError):
                raise FeatureStateError(
                    f"{file}: feature {name!r} refers to {target}, which it does not hold"
                ) from None
        out[field] = value
    return out


def read_features(path: str | Path, configs: Mapping[str, Any], expected_sha256: str | None = None) -> LearnedFeatures:
    """The learned features of `path`, held to the spec's `configs` (name -> config)."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as error:
        raise FeatureStateError(f"{file}: cannot be read ({error.strerror})") from None
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise FeatureStateError(f"{file}: its sha256 is not the one recorded beside it (changed since it was written)")
    return parse_features(data, configs, str(file))


def _same_config(stored: Any, config: Any) -> bool:
    """Whether a stored config is `config`'s; an option added later with a None default (a history's
    `where`) is absent from the files written before it, and such a file still loads."""
    if not isinstance(stored, dict):
        return False
    plain = config_json(config)
    return {k: v for k, v in stored.items() if v is not None} == {k: v for k, v in plain.items() if v is not None}


def parse_features(data: bytes, configs: Mapping[str, Any], file: str) -> LearnedFeatures:
    """`read_features` of a file's bytes; `file` names it in errors."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FeatureStateError(f"{file}: not a features file ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("version") not in READABLE:
        raise FeatureStateError(f"{file}: not a reccompile features file of version {VERSION}")
    stored = document.get("features", {})
    features = {}
    for name, config in configs.items():
        entry = stored.get(name)
        if entry is None or entry.get("kind") != config.kind or not _same_config(entry.get("config"), config):
            learned_as = (
                "is not learned there"
                if entry is None
                else (
                    f"was learned as {entry.get('kind')} {entry.get('config')}, the spec says {config.kind} "
                    f"{config_json(config)}"
                )
            )
            raise FeatureStateError(
                f"{file}: feature {name!r} {learned_as}; learn the features again "
                "(reccompile data prepare, or train on the raw files without --resume)"
            )
        version = transform(config.kind).version
        if entry.get("version") != version:
            raise FeatureStateError(
                f"{file}: feature {name!r} was learned by {config.kind} version "
                f"{entry.get('version')}, this runtime applies version {version}; "
                "learn the features again"
            )
        state = _resolve(entry["state"], stored, file, name)
        features[name] = Learned(config.kind, config, transform(config.kind).load(state))
    return LearnedFeatures(features, str(file))
