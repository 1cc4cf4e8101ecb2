# The two commands of the README: `make demo` and `make test`. Both set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup data demo test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP) data

data:
	bash scripts/fetch-data.sh

demo: setup
	$(BIN)/dpdistill demo --out runs/demo

# three workers on two cores, one torch thread each: one runs the Flower tests in turn (mostly waiting on their
# processes), the two others the rest (tests/conftest.py)
test: setup
	$(BIN)/python -m pytest -q -n 3

clean:
	rm -rf $(VENV) runs .pytest_cache
