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

# three workers of one torch thread on two cores: while one waits on other processes (Flower's, the ranks of a
# distributed run) the other two keep both cores busy (399-413 s against 463-512 s with two workers, peak 5.7 GB)
test: setup
	$(BIN)/python -m pytest -q -n 3

clean:
	rm -rf $(VENV) runs .pytest_cache
