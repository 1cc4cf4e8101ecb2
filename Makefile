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

# two workers, one torch thread each: runs that wait on processes (Flower) leave the other core busy
test: setup
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf $(VENV) runs .pytest_cache
