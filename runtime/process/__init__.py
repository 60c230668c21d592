"""The process itself: ranks, DataLoader and prepare workers that end when their parent does, and the
ranks' same-host shared-memory all-to-all (shm_exchange.py)."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(globals(), {"lifetime": ("die_with_parent", "set_parent_death_signal")})
