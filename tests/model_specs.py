"""The model specs every compiler test runs over: specs/*.yaml, the published models in specs/zoo/ and the
examples in specs/examples/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = sorted(
    p.relative_to(REPO).as_posix()
    for p in [
        *(REPO / "specs").glob("*.yaml"),
        *(REPO / "specs" / "zoo").glob("*.yaml"),
        *(REPO / "specs" / "examples").glob("*.yaml"),
    ]
)


def golden_stem(spec: str) -> str:
    """The golden-file name of a spec: `dlrm_criteo` for specs/dlrm_criteo.yaml, `zoo/autoint` for specs/zoo/autoint.yaml."""
    return Path(spec).relative_to("specs").with_suffix("").as_posix()
