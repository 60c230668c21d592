"""The training tests share the checkpoint tests' tiny spec and helpers (checkpoint_cases)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
