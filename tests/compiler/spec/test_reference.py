"""docs/spec.md is generated from the schema; this test regenerates it and fails if it drifted.

`pytest tests/compiler/spec/test_reference.py --update-goldens` rewrites it.
"""

from __future__ import annotations

from pathlib import Path

from compiler.spec.reference import render_reference
from compiler.spec.validate import load_schema


def test_docs_spec_md_is_generated_from_the_schema(golden, repo_root: Path) -> None:
    golden.check(repo_root / "docs" / "spec.md", render_reference(load_schema()))


def test_the_reference_documents_every_block_type_with_an_example() -> None:
    text = render_reference(load_schema())
    for block_type in ("mlp", "dot", "concat", "crossnet", "fm", "dot_product", "sum", "moe"):
        section = text.split(f"### {block_type} block\n", 1)[1].split("\n### ", 1)[0]
        assert f"```yaml\ntype: {block_type}\n" in section
