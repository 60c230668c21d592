"""Golden graphs for users: a model's canonical graph text kept in a file, a failure when it changes.

The graph text (`reccompile graph`) shows every stage of the distributed
program with output shapes and spec lines, so a diff of it is what changed
in the model's structure (blocks, their inputs, output widths, sharding);
hidden widths, table sizes, pooling and optimizers are not in it
(`reccompile show` prints them). Keep one per model beside your tests:

    from compiler.golden import check_graph

    def test_ranking_model_graph():
        check_graph("specs/ranking.yaml", "tests/golden/ranking.graph.txt")

A changed graph fails with a unified diff (GoldenMismatch is an
AssertionError, so pytest shows it as a failed assertion):

    the graph of specs/ranking.yaml differs from tests/golden/ranking.graph.txt (accept it with update=True):
    --- tests/golden/ranking.graph.txt (golden)
    +++ specs/ranking.yaml (graph)
    @@ -10,3 +10,4 @@
       %interaction: [B, 415] = call_module interaction(%bottom, %table_wise_embeddings)  # 1:dense  ...
    -  %top: [B, 1] = call_module top(%interaction)  # 1:dense  specs/ranking.yaml:16:3
    +  %top_input: [B, 479] = call_function torch.cat([%interaction, %bottom], dim=1)  # 1:dense  ...
    +  %top: [B, 1] = call_module top(%top_input)  # 1:dense  specs/ranking.yaml:16:3
       %click_output: [B] = call_method squeeze(%top, -1)  # 1:head  specs/ranking.yaml:19:5

`check_graph(..., update=True)`, or `reccompile graph SPEC --golden FILE
--update`, writes the current text instead; review its diff like code.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from compiler.lowering.graph_text import graph_text, stages_text
from compiler.pipeline import Options, compile_spec


class GoldenMismatch(AssertionError):
    """The graph is not the golden file's (or there is no golden file); the message holds the diff.

    The message says to rewrite the file with `update=True`; a caller that knows another way (the
    `reccompile graph` command line) words it with `explain`."""

    def __init__(self, spec_path: str | Path, golden: Path, diff: str | None) -> None:
        self.spec_path, self.golden, self.diff = spec_path, golden, diff  # diff None: no golden file
        super().__init__(self.explain("update=True"))

    def __reduce__(self) -> tuple[type, tuple[str | Path, Path, str | None]]:  # pickled by pytest-xdist
        return type(self), (self.spec_path, self.golden, self.diff)

    def explain(self, update: str) -> str:
        """The message, `update` saying how to write the current text to the golden file."""
        if self.diff is None:
            return f"{self.golden} does not exist: write it with {update}"
        return f"the graph of {self.spec_path} differs from {self.golden} (accept it with {update}):\n{self.diff}"


def current_graph(spec_path: str | Path, options: Options = Options(), *, stages: bool = False) -> str:
    """The canonical graph text of a spec, as `reccompile graph [--stages]` prints it."""
    lowered = compile_spec(str(spec_path), options)
    return stages_text(lowered) if stages else graph_text(lowered)


def check_graph(
    spec_path: str | Path,
    golden_path: str | Path,
    *,
    update: bool = False,
    options: Options = Options(),
    stages: bool = False,
) -> bool:
    """Compare the spec's graph text with the golden file; with `update`, rewrite the file.

    Returns whether the file was written. Raises GoldenMismatch (with a
    unified diff) when the text differs or the file is missing, and
    compiler.diagnostics.CompileError when the spec does not compile.
    `options` (compiler.pipeline.Options) set the world size and the like.
    """
    actual = current_graph(spec_path, options, stages=stages)
    golden = Path(golden_path)
    if update:
        if golden.exists() and golden.read_text() == actual:
            return False
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
        return True
    if not golden.exists():
        raise GoldenMismatch(spec_path, golden, None)
    expected = golden.read_text()
    if expected != actual:
        raise GoldenMismatch(spec_path, golden, unified_diff(expected, actual, golden, spec_path))
    return False


def unified_diff(expected: str, actual: str, golden: str | Path, spec_path: str | Path) -> str:
    """The diff from the golden text to the current one, labelled with both files."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{golden} (golden)",
            tofile=f"{spec_path} (graph)",
            n=1,
        )
    )
