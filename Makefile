# Two entry points: `make lab` (install and open JupyterLab) and `make test` (install and run every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: lab test lint browser-test screenshot install-lab install-test install-browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

install-lab: $(PY)
	$(PY) -m pip install --quiet -e ".[lab]"

install-test: $(PY)
	$(PY) -m pip install --quiet -e ".[test]"

lab: install-lab
	$(VENV)/bin/jupyter lab

test: install-test lint
	$(PY) -m pytest

# ruff (lint and format check), configured in pyproject.toml; `make test` runs it first.
lint: install-test
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(VENV)/bin/ruff format --check src tests benchmarks notebooks

# The real-browser test alone (JupyterLab + Debian's Chromium through Playwright), and the
# README's screenshot of the placement lab, which that test saves.
install-browser:
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)

browser-test: install-test install-browser
	$(PY) -m pytest -q tests/browser

screenshot: install-test install-browser
	RL_LAB_SCREENSHOT=docs/lab.png $(PY) -m pytest -q tests/browser

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info
