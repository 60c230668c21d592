"""The other side of the differential tests: the same calls run under TorchRec 1.8 in its own venv.

A cases module (a file beside its test, importing torch only) defines
`cases(**classes) -> dict` that makes its calls on the classes it is given
and returns plain data (tensors, lists, dicts, numbers, None), and may define
`differences(**classes)`, the calls whose results differ by design. A test calls
it with the runtime's classes in-process and `torchrec_results` runs it with
TorchRec's in /tmp/venv-torchrec (never a dependency of the project; built by
../shared/bench/setup_torchrec_venv.sh), so both sides run the one source.
Tests skip, saying so, where that venv does not exist.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

TORCHREC_PYTHON = Path("/tmp/venv-torchrec/bin/python")

_RUNNER = textwrap.dedent("""
    import importlib, sys
    import torch
    directory, module, output, imports = sys.argv[1:5]
    sys.path.insert(0, directory)
    classes = {}
    for spec in imports.split(","):
        source, name = spec.rsplit(".", 1)
        classes[name] = getattr(importlib.import_module(source), name)
    module = importlib.import_module(module)
    calls = [name for name in ("cases", "differences") if hasattr(module, name)]
    torch.save({name: getattr(module, name)(**classes) for name in calls}, output)
""")


def torchrec_results(cases_file: Path, classes: dict[str, str], output: Path) -> dict[str, Any]:
    """What `cases_file`'s `cases` (and `differences`) return given TorchRec's classes
    (`name -> torchrec.module.Name`), by function name."""
    arguments = [str(cases_file.parent), cases_file.stem, str(output), ",".join(classes.values())]
    _run(["-c", _RUNNER, *arguments], cases_file.name)
    return torch.load(output, weights_only=False)


def torchrec_script(script: str, inputs: Any, directory: Path) -> Any:
    """What `script` saves to sys.argv[2], run in TorchRec's venv with `inputs` saved at sys.argv[1]."""
    torch.save(inputs, directory / "inputs.pt")
    _run(["-c", textwrap.dedent(script), str(directory / "inputs.pt"), str(directory / "outputs.pt")], "script")
    return torch.load(directory / "outputs.pt", weights_only=False)


def _run(arguments: list[str], what: str) -> None:
    if not TORCHREC_PYTHON.exists():
        pytest.skip(f"no TorchRec venv at {TORCHREC_PYTHON}: the differential test against TorchRec 1.8 needs it")
    done = subprocess.run([str(TORCHREC_PYTHON), *arguments], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise AssertionError(f"TorchRec's side of {what} failed (exit {done.returncode})")


def assert_same(ours: Any, theirs: Any, where: str = "", exact: bool = True) -> None:
    """Equal structure; tensors of equal dtype and shape, equal values (or close, when not `exact`)."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), (where, ours)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (where, ours, theirs)
        if exact:
            assert torch.equal(ours, theirs), (where, ours, theirs)
        else:
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=where)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (where, ours, theirs)
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}.{key}", exact)
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (mine, other) in enumerate(zip(ours, theirs)):
            assert_same(mine, other, f"{where}[{i}]", exact)
    else:
        assert ours == theirs, (where, ours, theirs)
