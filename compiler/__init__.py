"""reccompile: the spec compiler (YAML spec -> IR -> plan -> fx graph -> Python module)."""

from __future__ import annotations

__version__ = "0.1.0"


def _check_runtime() -> None:
    """Refuse a `runtime` package that is not reccompile's (generic top-level names collide on the index)."""
    import runtime

    if getattr(runtime, "DISTRIBUTION", None) != "reccompile":
        raise ImportError(
            f"the 'runtime' package found at {getattr(runtime, '__file__', None) or runtime.__path__} is not "
            "reccompile's: another distribution with a top-level 'runtime' package shadows it; uninstall it "
            "or install reccompile in a virtual environment of its own"
        )


_check_runtime()
