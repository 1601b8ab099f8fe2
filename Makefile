# Two commands: `make demo` and `make test`. Both create .venv when missing and install
# the exact versions in requirements/test.lock.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements/test.lock

.PHONY: demo test test-compat docs lint lock lock-compat bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml $(LOCK)
	$(BIN)/pip install -q -c $(LOCK) -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m layerfit.demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

# The wheel, installed beside a given torch on Python 3.10 and 3.13 and as the light
# core alone (tools/compat_matrix.py). PYTHONS='3.10=/path/python3.10 ...' to choose
# the interpreters; by default pyenv's, then pythonX.Y on PATH.
test-compat: $(STAMP)
	$(BIN)/python tools/compat_matrix.py

# The documentation site: generated pages (benches from bench/results/*.json, the CLI
# reference, the metrics) first, then MkDocs with --strict (a broken link or reference
# fails), offline, into build/site. tests/docs runs the guides' runnable blocks.
docs: $(STAMP)
	$(BIN)/python tools/docs_pages.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check .

# Resolve the dependencies afresh and pin what came: the test lock, then each leg's.
lock: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	{ sed -n '1,3p' $(LOCK); $(BIN)/pip freeze --exclude-editable | grep -v '^layerfit' | sed 's/+cpu$$//'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	touch $(STAMP)

lock-compat: $(STAMP)
	$(BIN)/python tools/compat_matrix.py --relock

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
