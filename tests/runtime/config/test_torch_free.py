"""runtime/config/: the contract room imports no torch, and each name is defined where the package says.

The compiler, the data readers and reporting read these configs; a fresh
interpreter that imports every module of runtime.config and reads every
name it exports must not have imported torch, fbgemm_gpu or numpy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import runtime.config

ROOT = Path(__file__).resolve().parents[3]
MODULES = sorted(p.stem for p in (ROOT / "runtime" / "config").glob("*.py") if p.stem != "__init__")


def test_importing_the_configs_does_not_import_torch() -> None:
    code = (
        "import sys, runtime.config\n"
        f"for module in {MODULES!r}:\n"
        "    __import__('runtime.config.' + module)\n"
        "[getattr(runtime.config, name) for name in runtime.config.__all__]\n"
        "print(sorted(m for m in ('torch', 'fbgemm_gpu', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


def test_the_package_names_every_config_of_its_modules() -> None:
    assert MODULES == ["data", "embeddings", "heads", "lr_schedule", "retrieval", "training", "transforms"]
    for name in runtime.config.__all__:
        value = getattr(runtime.config, name)
        assert value.__module__.startswith("runtime.config."), (name, value.__module__)
