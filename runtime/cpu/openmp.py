"""The OpenMP setting a training process takes before torch loads.

After each parallel region, torch's OpenMP workers (libgomp) spin for
GOMP_SPINCOUNT iterations before they sleep: 300,000 by default, several
milliseconds. A training step hands its table groups' lookups and updates
to threads of its own (runtime/embeddings/concurrent.py) just after the
dense backward's GEMMs, and the spinning worker holds the core one of
them needs. On the 2-core AVX2 EPYC (dlrm-bench criteo, local, 2 threads)
the second group's update started 2-3.5 ms after the first, so the two ran
one after the other: 7.4-8.8 ms for both. With a spin of 1,000 iterations
they overlap (3.8-4.3 ms), and a step is 7-8% faster (28,117 / 26,498 /
28,465 against 30,569 / 28,642 / 30,264 samples/s, alternated). Serving
(`predict`) keeps the default: its ops follow one another without such hand-offs.

libgomp reads the variable once, when it loads (with torch), so
`training_environment` must run before torch is imported; torchrun's ranks
and other children inherit it. A value the user set stands.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = ["SPINCOUNT", "VARIABLE", "training_environment"]

VARIABLE = "GOMP_SPINCOUNT"
SPINCOUNT = "1000"


def training_environment(environ: MutableMapping[str, str]) -> bool:
    """Sets GOMP_SPINCOUNT in `environ` (os.environ) unless it is set; True if it was set here."""
    if VARIABLE in environ:
        return False
    environ[VARIABLE] = SPINCOUNT
    return True
