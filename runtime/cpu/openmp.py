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
and other children inherit it. A value the user set stands, and so does a
user's OMP_WAIT_POLICY: libgomp takes GOMP_SPINCOUNT over the policy when
both are set (env.c), so setting ours would silently undo theirs.

On the 2-core Zen 4 of issue 41 a poll of the spin takes about 25 ns
(1,000 is 25 us; libgomp's default of 300,000, 7.5 ms). There, on the shared
machine (load 12-20), dlrm-bench criteo local at 2 threads took 98 / 161 /
1658 / 1036 ms a step and 91 / 103 / 310 / 407 ms of CPU at 1,000 / 10,000 /
100,000 / 300,000 (one process each, native update, sequential lookups); with
benchmarks/ab_openmp.sh (3 rounds) the medians were 110 / 119 / 161 / 238 ms of
CPU a step at 0 / 1,000 / 4,000 / 10,000. A spinning worker holds the core that
the main thread, descheduled by a neighbour, waits for. Quiet, a longer spin
would bridge the step's main-only gaps (about 37 a step longer than 25 us, most
of 0.1-1 ms, 6-9 ms in all), so the quiet choice is measured with
benchmarks/ab_openmp.sh, not assumed.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = ["SPINCOUNT", "VARIABLE", "training_environment"]

VARIABLE = "GOMP_SPINCOUNT"
SPINCOUNT = "1000"
POLICY = "OMP_WAIT_POLICY"  # the user's choice of spin (active) or none (passive), which ours would override


def training_environment(environ: MutableMapping[str, str]) -> bool:
    """Sets GOMP_SPINCOUNT in `environ` (os.environ) unless it or OMP_WAIT_POLICY is set; True if it was set here."""
    if VARIABLE in environ or POLICY in environ:
        return False
    environ[VARIABLE] = SPINCOUNT
    return True
