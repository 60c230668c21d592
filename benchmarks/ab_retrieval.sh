#!/usr/bin/env bash
# retrieval-bench, ours against the TorchRec anchor, alternated: ROUNDS pairs in MODE (local or dist2),
# ours first in odd rounds and TorchRec first in even ones (neither always runs just after the other),
# one line per pair with the load average, then each pair's ratio and their median;
# the same for CPU ms per step (every rank's, TorchRec's over ours), steadier than wall time when shared.
# Each line also gives both sides' median step and its 10th-90th percentiles in ms: a run slow all
# through (the 10th percentile up too) is not a run with a few slow steps (only the 90th), and ours
# the host's sgemm rate at its threads just after it (retrieval_bench.py's sgemm_gflops).
#
#   benchmarks/ab_retrieval.sh [MODE] [ROUNDS] [extra options for both, e.g. --threads 2]
#
# Both scripts pick their threads as they do alone (local: ours the free cores, TorchRec torch's
# default; dist2: one each) unless told; each line says how many ours took (local: fewer than the
# cores where another process held one at its start). OURS_PY and TORCHREC_PY name the interpreters (defaults: the
# project venv beside this checkout's main, and /tmp/venv-torchrec). Run it on a quiet machine:
# on a shared one, read the pairs' ratios, not the absolute figures.
set -euo pipefail
MODE=${1:-local}
ROUNDS=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
HERE=$(cd "$(dirname "$0")/.." && pwd)
OURS_PY=${OURS_PY:-/work/main/.venv/bin/python}
TORCHREC_PY=${TORCHREC_PY:-/tmp/venv-torchrec/bin/python}
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" | tail -1; }
steps() { sed -n 's/.*"step_ms_median": \([0-9.]*\).*"step_ms_p10_p90": \[\([0-9.]*\), \([0-9.]*\)\].*/\1 (\2-\3)/p' | tail -1; }
ratios=()
cpu_ratios=()
run_ours() {
    local line
    line=$(cd "$HERE" && PYTHONPATH="$HERE" "$OURS_PY" benchmarks/retrieval_bench.py --mode "$MODE" "$@" 2>/dev/null | tail -1)
    ours=$(field samples_per_s <<<"$line") ours_cpu=$(field cpu_ms_per_step <<<"$line")
    ours_threads=$(field threads_per_proc <<<"$line") ours_steps=$(steps <<<"$line") sgemm=$(field sgemm_gflops <<<"$line")
    load_ours=$(cut -d' ' -f1 /proc/loadavg)
}
run_theirs() {
    local line
    line=$(cd "$HERE" && "$TORCHREC_PY" benchmarks/torchrec_retrieval_anchor.py --mode "$MODE" "$@" 2>/dev/null | tail -1)
    theirs=$(field samples_per_s <<<"$line") theirs_cpu=$(field cpu_ms_per_step <<<"$line") theirs_steps=$(steps <<<"$line")
    load_theirs=$(cut -d' ' -f1 /proc/loadavg)
}
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then  # odd rounds ours first, even rounds TorchRec first: neither always follows the other
        first=ours
        run_ours "$@"
        run_theirs "$@"
    else
        first=torchrec
        run_theirs "$@"
        run_ours "$@"
    fi
    ratio=$(python3 -c "print(round($ours / $theirs, 3))")
    cpu_ratio=$(python3 -c "print(round($theirs_cpu / $ours_cpu, 3))")
    ratios+=("$ratio")
    cpu_ratios+=("$cpu_ratio")
    echo "round $round $MODE ($first first): ours $ours samples/s, $ours_cpu CPU ms/step, $ours_threads threads" \
        "(load $load_ours), torchrec $theirs, $theirs_cpu (load $load_theirs): $ratio, CPU $cpu_ratio;" \
        "step ms median (p10-p90) ours $ours_steps, torchrec $theirs_steps; sgemm $sgemm GFLOP/s"
done
median() { python3 -c "import statistics, sys; r = [float(x) for x in sys.argv[2:]]; print(f'median {sys.argv[1]} {statistics.median(r):.3f} over {len(r)} pairs: {r}')" "$@"; }
median "ours/torchrec" "${ratios[@]}"
median "CPU per step torchrec/ours" "${cpu_ratios[@]}"
