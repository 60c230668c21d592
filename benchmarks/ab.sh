#!/usr/bin/env bash
# A training benchmark, ours against its TorchRec anchor, alternated: ROUNDS pairs of WORKLOAD in MODE,
# ours first in odd rounds and TorchRec first in even ones (neither always runs just after the other),
# one line per pair with the load average, then each pair's ratio and their median;
# the same for CPU ms per step (every rank's, TorchRec's over ours), steadier than wall time when shared.
# Each line also gives both sides' median step and its 10th-90th percentiles in ms where the scripts
# report them: a run slow all through (the 10th percentile up too) is not a run with a few slow steps
# (only the 90th); and the host's sgemm rate at our threads (sgemm_gflops).
#
#   benchmarks/ab.sh WORKLOAD [MODE] [ROUNDS] [extra options for both, e.g. --threads 2]
#
# WORKLOAD      ours                                      TorchRec's
#   criteo      dlrm_bench.py --variant criteo            ../shared/bench/torchrec_bench.py --variant criteo
#   multihot    dlrm_bench.py --variant multihot          ../shared/bench/torchrec_bench.py --variant multihot
#   retrieval   retrieval_bench.py                        benchmarks/torchrec_retrieval_anchor.py
#   gen         gen_bench.py                              ../shared/bench/torchrec_gen_bench.py
#   seq         seq_bench.py                              ../shared/bench/torchrec_seq_bench.py
#
# Both scripts pick their threads as they do alone (local: ours the free cores, TorchRec torch's
# default; dist2: one each) unless told; each line says how many ours took (local: fewer than the
# cores where another process held one at its start). In dist2 TorchRec's dlrm anchor runs with
# --pipeline when THEIR_OPTS says so (THEIR_OPTS=--pipeline). OURS_PY and TORCHREC_PY name the
# interpreters (defaults: the project venv beside this checkout, and /tmp/venv-torchrec);
# RECCOMPILE_BENCH_WORKLOADS the folder of the shared anchors (default ../shared/bench).
# Run it on a quiet machine: on a shared one, read the pairs' ratios, not the absolute figures.
set -euo pipefail
WORKLOAD=${1:?"usage: ab.sh WORKLOAD [MODE] [ROUNDS] [options]: WORKLOAD is criteo, multihot, retrieval, gen or seq"}
MODE=${2:-local}
ROUNDS=${3:-5}
shift $(( $# < 3 ? $# : 3 ))
HERE=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${RECCOMPILE_BENCH_WORKLOADS:-$HERE/../shared/bench}
OURS_PY=${OURS_PY:-$HERE/.venv/bin/python}
TORCHREC_PY=${TORCHREC_PY:-/tmp/venv-torchrec/bin/python}
THEIR_OPTS=${THEIR_OPTS:-}
case "$WORKLOAD" in
    criteo|multihot) ours_cmd=(benchmarks/dlrm_bench.py --variant "$WORKLOAD")
                     theirs_cmd=("$SHARED/torchrec_bench.py" --variant "$WORKLOAD") ;;
    retrieval) ours_cmd=(benchmarks/retrieval_bench.py) theirs_cmd=(benchmarks/torchrec_retrieval_anchor.py) ;;
    gen) ours_cmd=(benchmarks/gen_bench.py) theirs_cmd=("$SHARED/torchrec_gen_bench.py") ;;
    seq) ours_cmd=(benchmarks/seq_bench.py) theirs_cmd=("$SHARED/torchrec_seq_bench.py") ;;
    *) echo "error: ab.sh: unknown WORKLOAD '$WORKLOAD' (criteo, multihot, retrieval, gen or seq)" >&2; exit 2 ;;
esac
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" | tail -1; }
steps() { sed -n 's/.*"step_ms_median": \([0-9.]*\).*"step_ms_p10_p90": \[\([0-9.]*\), \([0-9.]*\)\].*/\1 (\2-\3)/p' | tail -1; }
ratios=()
cpu_ratios=()
run_ours() {
    local line
    line=$(cd "$HERE" && PYTHONPATH="$HERE" "$OURS_PY" "${ours_cmd[@]}" --mode "$MODE" "$@" 2>/dev/null | tail -1)
    ours=$(field samples_per_s <<<"$line") ours_cpu=$(field cpu_ms_per_step <<<"$line")
    ours_threads=$(field threads_per_proc <<<"$line") ours_steps=$(steps <<<"$line") sgemm=$(field sgemm_gflops <<<"$line")
    load_ours=$(cut -d' ' -f1 /proc/loadavg)
}
run_theirs() {
    local line
    # shellcheck disable=SC2086  # THEIR_OPTS is a list of options
    line=$(cd "$HERE" && "$TORCHREC_PY" "${theirs_cmd[@]}" --mode "$MODE" $THEIR_OPTS "$@" 2>/dev/null | tail -1)
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
    ratios+=("$ratio")
    cpu_note=""
    if [[ -n "$ours_cpu" && -n "$theirs_cpu" ]]; then
        cpu_ratio=$(python3 -c "print(round($theirs_cpu / $ours_cpu, 3))")
        cpu_ratios+=("$cpu_ratio")
        cpu_note=", CPU $cpu_ratio"
    fi
    echo "round $round $WORKLOAD $MODE ($first first): ours $ours samples/s, ${ours_cpu:-?} CPU ms/step," \
        "${ours_threads:-?} threads (load $load_ours), torchrec $theirs, ${theirs_cpu:-?} (load $load_theirs):" \
        "$ratio$cpu_note; step ms median (p10-p90) ours ${ours_steps:-?}, torchrec ${theirs_steps:-?};" \
        "sgemm ${sgemm:-?} GFLOP/s"
done
median() { python3 -c "import statistics, sys; r = [float(x) for x in sys.argv[2:]]; print(f'median {sys.argv[1]} {statistics.median(r):.3f} over {len(r)} pairs: {r}')" "$@"; }
median "$WORKLOAD $MODE ours/torchrec" "${ratios[@]}"
if ((${#cpu_ratios[@]})); then median "$WORKLOAD $MODE CPU per step torchrec/ours" "${cpu_ratios[@]}"; fi
