#!/usr/bin/env bash
# dlrm-bench under several OpenMP wait settings, alternated: ROUNDS rounds of one run per setting,
# one line per run with the load average, then each setting's median samples/s and CPU ms per step
# and its per-round ratios against the first setting (same round, so the same noise of a shared machine).
#
#   benchmarks/ab_openmp.sh ROUNDS SETTING... [-- options for dlrm_bench.py]
#   benchmarks/ab_openmp.sh 5 GOMP_SPINCOUNT=1000 GOMP_SPINCOUNT=10000 GOMP_SPINCOUNT=300000
#
# A SETTING is VAR=VALUE[,VAR=VALUE...], put in the run's environment. torch's OpenMP runtime is
# libgomp (MKL's and oneDNN's GEMMs run on its threads too; KMP_* variables are Intel's runtime's), so
# GOMP_SPINCOUNT is the knob: how many polls (about 25 ns each on the 2-core Zen 4) a worker spins
# after a parallel region before it sleeps on a futex. 300000 is libgomp's own default, 0 sleeps at
# once (as OMP_WAIT_POLICY=passive; active spins without end), and a run with neither variable set
# takes runtime/cpu/openmp.py's value. The dlrm_bench.py options
# default to `--variant criteo --mode local --threads 2`. OURS_PY names the interpreter (default:
# the project venv beside this checkout's main). The choice is the quiet machine's: on a shared one,
# spinning holds a core another process needs, so read the ratios as directions only.
set -euo pipefail
ROUNDS=${1:?usage: ab_openmp.sh ROUNDS SETTING... [-- dlrm_bench options]}
shift
settings=()
while (($#)) && [[ $1 != -- ]]; do
    settings+=("$1")
    shift
done
(($#)) && shift
((${#settings[@]})) || { echo "error: ab_openmp.sh: name at least one SETTING (e.g. GOMP_SPINCOUNT=1000)" >&2; exit 2; }
for setting in "${settings[@]}"; do
    [[ $setting =~ ^[A-Z_][A-Z0-9_]*=[^,]*(,[A-Z_][A-Z0-9_]*=[^,]*)*$ ]] ||
        { echo "error: ab_openmp.sh: setting '$setting' is not VAR=VALUE[,VAR=VALUE...]" >&2; exit 2; }
done
options=("$@")
((${#options[@]})) || options=(--variant criteo --mode local --threads 2)
HERE=$(cd "$(dirname "$0")/.." && pwd)
OURS_PY=${OURS_PY:-/work/main/.venv/bin/python}
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" | tail -1; }
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$ROUNDS"); do
    for index in "${!settings[@]}"; do
        IFS=, read -ra assignments <<<"${settings[$index]}"
        line=$(cd "$HERE" && env "${assignments[@]}" PYTHONPATH="$HERE" "$OURS_PY" benchmarks/dlrm_bench.py \
            "${options[@]}" 2>/dev/null | tail -1)
        rate=$(field samples_per_s <<<"$line") cpu=$(field cpu_ms_per_step <<<"$line")
        load=$(cut -d' ' -f1 /proc/loadavg)
        [[ -n $rate && -n $cpu ]] ||
            { echo "error: ab_openmp.sh: dlrm_bench.py printed no result under ${settings[$index]}" >&2; exit 1; }
        echo "round $round ${settings[$index]}: $rate samples/s, $cpu CPU ms/step (load $load)"
        echo "$round $index $rate $cpu" >>"$results"
    done
done
"$OURS_PY" - "$results" "${settings[@]}" <<'EOF'
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1])]
settings = sys.argv[2:]
runs = {(int(r), int(i)): (float(rate), float(cpu)) for r, i, rate, cpu in rows}
rounds = sorted({r for r, _ in runs})
for index, setting in enumerate(settings):
    rates = [runs[r, index][0] for r in rounds]
    cpus = [runs[r, index][1] for r in rounds]
    ratios = [runs[r, index][0] / runs[r, 0][0] for r in rounds]
    print(
        f"{setting}: median {statistics.median(rates):.1f} samples/s, {statistics.median(cpus):.1f} CPU ms/step;"
        f" against {settings[0]}: median {statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})"
    )
EOF
