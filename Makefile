# The two commands of the README: `make run` and `make test`. Both set up a
# project-local .venv first; re-running is fast when nothing changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CUDA build of fbgemm-gpu where a GPU answers, the CPU build elsewhere.
FLAVOUR := $(shell nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)
STAMP := $(VENV)/.installed-$(FLAVOUR)

.PHONY: setup run test test-fast bench bench-data gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: a range would pull a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[$(FLAVOUR),test,faiss]'
	rm -f $(VENV)/.installed-*
	touch $@

# The main job: compile the default spec, then train it briefly on two local ranks.
run: setup
	$(VENV)/bin/reccompile specs/dlrm_criteo.yaml --world-size 2 -o build
	$(VENV)/bin/reccompile train specs/dlrm_criteo.yaml --nproc 2 --steps 40 --batch-size 1024 --log-every 5 -o build

# One pytest-xdist worker per CPU (-n auto). --dist loadfile keeps each test file on one worker, so
# a module-scoped fixture (many compile or train a model once for the whole file) is computed once,
# as in a serial run; `load` and `worksteal` would split a file and compute it on each worker. A
# plain `pytest -q` still runs everything serially.
# Files that start two ranks are not grouped on one worker: two such files at once took 20-23 s against 17 s
# one after the other (test_sharded_training + test_train_pipeline, 2 cores), a small loss next to
# the suite's gain; keeping them on one worker would need --dist loadgroup and a group per file.
# `--durations` names the slowest tests of every full run, so a slow newcomer is seen when it lands.
test: setup
	$(PY) -m pytest -q -n auto --dist loadfile --durations=15

# Everything but the files that start ranks (the `ranks` marker, set in tests/conftest.py): for the
# edit-test loop. `make test` stays the one that counts.
test-fast: setup
	$(PY) -m pytest -q -n auto --dist loadfile -m "not ranks"

# dlrm-bench (../shared/bench/WORKLOAD.md), both variants, one process then two ranks; seq-bench
# (../shared/bench/SEQUENCE.md) likewise; retrieval-bench (benchmarks/retrieval_workload.py) training
# locally and on two ranks, retrieve latency per index, and its TorchRec anchor where the venv is; then
# inference-bench (../shared/bench/INFERENCE.md) per table precision, against TorchRec where its
# venv is (bash ../shared/bench/setup_torchrec_venv.sh /tmp/venv-torchrec), in blocks that alternate
# between the two live processes; gen-bench (../shared/bench/GENERATIVE.md) beside its TorchRec anchor,
# local then two ranks, and through the hstu block (its own cost, no anchor).
TORCHREC_PY := /tmp/venv-torchrec/bin/python
GEN_ANCHOR := $(or $(RECCOMPILE_BENCH_WORKLOADS),../shared/bench)/torchrec_gen_bench.py
bench: setup
	$(PY) benchmarks/dlrm_bench.py --mode local
	$(PY) benchmarks/dlrm_bench.py --mode dist2
	$(PY) benchmarks/seq_bench.py --mode local
	$(PY) benchmarks/seq_bench.py --mode dist2
	$(PY) benchmarks/retrieval_bench.py --mode local
	$(PY) benchmarks/retrieval_bench.py --mode dist2
	$(PY) benchmarks/retrieval_bench.py --mode retrieve
	$(if $(wildcard $(TORCHREC_PY)),$(TORCHREC_PY) benchmarks/torchrec_retrieval_anchor.py --mode local)
	$(if $(wildcard $(TORCHREC_PY)),$(TORCHREC_PY) benchmarks/torchrec_retrieval_anchor.py --mode dist2)
	$(PY) benchmarks/inference_bench.py --configs fp32,fp16,int8,int4 \
		$(if $(wildcard $(TORCHREC_PY)),--blocks 10 --torchrec-python $(TORCHREC_PY),--rounds 1 --skip-torchrec)
	$(PY) benchmarks/gen_bench.py --mode local
	$(if $(wildcard $(TORCHREC_PY)),$(if $(wildcard $(GEN_ANCHOR)),$(TORCHREC_PY) $(GEN_ANCHOR) --mode local))
	$(PY) benchmarks/gen_bench.py --mode dist2
	$(if $(wildcard $(TORCHREC_PY)),$(if $(wildcard $(GEN_ANCHOR)),$(TORCHREC_PY) $(GEN_ANCHOR) --mode dist2))
	$(PY) benchmarks/gen_bench.py --mode local --block hstu

# gpu-check (benchmarks/gpu_check.py): every sharding type, the pipeline, export and predict, and
# dlrm-bench on one CUDA GPU, a JSON line per check and a summary; without a GPU it says so and exits 0.
gpu-check: setup
	$(PY) benchmarks/gpu_check.py

# data-bench (benchmarks/data_bench.py, issue 19): prepare rows/s, each rank's decoded rows at N = 1, 2, 4,
# and the dlrm-bench step on prepared data against synthetic batches; the last line sums it up.
bench-data: setup
	$(PY) benchmarks/data_bench.py

clean:
	rm -rf $(VENV) build .pytest_cache
