#!/usr/bin/env bash
# retrieval-bench, ours against the TorchRec anchor, alternated: ROUNDS pairs (ours, then TorchRec) in
# MODE (local or dist2), one line per run with the load average, then each pair's ratio and their median.
#
#   benchmarks/ab_retrieval.sh [MODE] [ROUNDS] [extra options for both, e.g. --threads 2]
#
# Both scripts pick their threads as they do alone (local: ours the free cores, TorchRec torch's
# default; dist2: one each) unless told. OURS_PY and TORCHREC_PY name the interpreters (defaults: the
# project venv beside this checkout's main, and /tmp/venv-torchrec). Run it on a quiet machine:
# on a shared one, read the pairs' ratios, not the absolute figures.
set -euo pipefail
MODE=${1:-local}
ROUNDS=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
HERE=$(cd "$(dirname "$0")/.." && pwd)
OURS_PY=${OURS_PY:-/work/main/.venv/bin/python}
TORCHREC_PY=${TORCHREC_PY:-/tmp/venv-torchrec/bin/python}
rate() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | tail -1; }
ratios=()
for round in $(seq "$ROUNDS"); do
    ours=$(cd "$HERE" && PYTHONPATH="$HERE" "$OURS_PY" benchmarks/retrieval_bench.py --mode "$MODE" "$@" 2>/dev/null | rate)
    load_ours=$(cut -d' ' -f1 /proc/loadavg)
    theirs=$(cd "$HERE" && "$TORCHREC_PY" benchmarks/torchrec_retrieval_anchor.py --mode "$MODE" "$@" 2>/dev/null | rate)
    load_theirs=$(cut -d' ' -f1 /proc/loadavg)
    ratio=$(python3 -c "print(round($ours / $theirs, 3))")
    ratios+=("$ratio")
    echo "round $round $MODE: ours $ours samples/s (load $load_ours), torchrec $theirs (load $load_theirs): $ratio"
done
python3 -c "import statistics, sys; r = [float(x) for x in sys.argv[1:]]; print(f'median ours/torchrec {statistics.median(r):.3f} over {len(r)} pairs: {r}')" "${ratios[@]}"
