"""CPU specifics: native C kernels built on first use (`runtime.cpu.native`), the allocator."""

from __future__ import annotations

from runtime import lazy_exports

lazy_exports(globals(), {"allocator": ("frozen_objects", "retain_freed_memory")})
