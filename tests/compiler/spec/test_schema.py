"""Tests of compiler/spec/schema.json itself: well-formed, documented, and agreeing with the IR."""

from __future__ import annotations

import keyword
import typing
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from compiler.ir import Data
from compiler.spec.load import load
from compiler.spec.validate import PATTERN_HINTS, load_schema, validate
from runtime.data.reader_names import READERS
from runtime.sharding.types import COMPUTE_KERNELS, SHARDING_TYPES

MINIMAL = """\
version: 1
name: minimal
features:
  sparse: [{name: s, num_embeddings: 10, dim: 4}]
model:
  a: {type: mlp, input: sparse.s, layers: [4, 1]}
heads:
  - {name: y, input: a, loss: bce}
"""


def properties(schema: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, property schema) pair in the schema (`if` conditions are not properties)."""
    if isinstance(schema, dict):
        for key, value in schema.get("properties", {}).items():
            yield f"{where}.{key}", value
        for key, value in schema.items():
            if key != "if":
                yield from properties(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from properties(item, f"{where}[{index}]")


def test_the_schema_is_valid_draft_2020_12() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_property_has_a_description() -> None:
    missing = [path for path, prop in properties(load_schema()) if not prop.get("description")]
    assert missing == []


def test_every_object_refuses_unknown_keys() -> None:
    schema = load_schema()
    open_objects = [
        name
        for name, definition in schema["$defs"].items()
        if definition.get("type") == "object" and "properties" in definition and name != "block"
        if definition.get("additionalProperties") is not False
    ]
    assert open_objects == []


def test_names_exclude_every_python_keyword() -> None:
    assert set(keyword.kwlist) <= set(load_schema()["$defs"]["name"]["not"]["enum"])


def test_the_full_example_is_a_valid_spec(tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump(load_schema()["examples"][0]))
    assert validate(load(str(path))).name == "tiny_dlrm"


@pytest.mark.parametrize(
    "block_type",
    [
        "mlp",
        "dot",
        "concat",
        "crossnet",
        "fm",
        "dot_product",
        "sum",
        "moe",
        "sequence_pool",
        "target_attention",
        "transformer",
        "hstu",
        "product",
        "activation",
    ],
)
def test_each_block_type_has_a_valid_example(block_type: str) -> None:
    schema = load_schema()
    validator = jsonschema.Draft202012Validator({"$ref": "#/$defs/block", "$defs": schema["$defs"]})
    (example,) = schema["$defs"][block_type]["examples"]
    assert example["type"] == block_type
    validator.validate(example)


def test_documented_defaults_are_the_ir_defaults(tmp_path: Path) -> None:
    path = tmp_path / "minimal.yaml"
    path.write_text(MINIMAL)
    ir = validate(load(str(path)))
    defs = load_schema()["$defs"]

    def default(definition: str, key: str) -> Any:
        return defs[definition]["properties"][key]["default"]

    feature, table, head = ir.sparse[0], ir.tables[0], ir.heads[0]
    training, sharding = ir.training, ir.sharding
    assert (feature.ids_per_sample, feature.weighted, feature.hashed) == (
        default("sparse_feature", "ids_per_sample"),
        default("sparse_feature", "weighted"),
        default("sparse_feature", "hash"),
    )
    assert table.pooling == default("table", "pooling") == default("sparse_feature", "pooling")
    assert ir.blocks[0].op.activation == default("mlp", "activation")  # type: ignore[union-attr]
    assert head.weight == default("head", "weight")
    assert (training.batch_size, training.seed, training.steps) == (
        default("training", "batch_size"),
        default("training", "seed"),
        default("training", "steps"),
    )
    for name in ("dense_optimizer", "sparse_optimizer"):
        documented = default("training", name)
        actual = getattr(training, name)
        assert (actual.type, actual.lr) == (documented["type"], documented["lr"])
    optimizer = training.dense_optimizer
    for key in ("lr", "eps", "weight_decay", "beta1", "beta2"):
        assert getattr(optimizer, key) == default("optimizer", key)
    assert (sharding.world_size, sharding.device) == (default("sharding", "world_size"), default("sharding", "device"))


def test_every_pattern_has_a_readable_message() -> None:
    patterns = set()
    stack: list[Any] = [load_schema()]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("pattern"), str):
                patterns.add(item["pattern"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    assert patterns == set(PATTERN_HINTS)


def test_sharding_types_and_kernels_are_the_runtimes() -> None:
    constraint = load_schema()["$defs"]["constraint"]["properties"]
    assert tuple(constraint["sharding_types"]["items"]["enum"]) == SHARDING_TYPES
    assert tuple(constraint["compute_kernels"]["items"]["enum"]) == COMPUTE_KERNELS


def test_the_data_readers_are_the_runtimes() -> None:
    """The schema's enum and the IR's Literal list the readers of runtime/data/reader_names.py, in its order."""
    reader = load_schema()["$defs"]["data"]["properties"]["reader"]
    assert tuple(reader["enum"]) == READERS
    assert typing.get_args(typing.get_type_hints(Data)["reader"]) == READERS
