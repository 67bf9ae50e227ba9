# Two entry points: `make lab` (install and open JupyterLab) and `make test` (install and run every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: lab test install-lab install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install-lab: $(PY)
	$(PY) -m pip install --quiet -e ".[lab]"

install-test: $(PY)
	$(PY) -m pip install --quiet -e ".[test]"

lab: install-lab
	$(VENV)/bin/jupyter lab

test: install-test
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info
