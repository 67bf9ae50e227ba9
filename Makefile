# Entry points: `make lab` (install and open JupyterLab), `make test` (install and run every test)
# and `make test-fast` (the tests that build no cluster and start no process).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: lab test test-fast test-newest lint browser-test screenshot install-lab install-test install-browser clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# pip runs again only when pyproject.toml changed (the install is editable: source edits need none).
LAB_STAMP := $(VENV)/.installed-lab
TEST_STAMP := $(VENV)/.installed-test

$(LAB_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[lab]"
	touch $@

# The tests also install the [tunix] extra (Tunix's own RLCluster, about 0.8 GB, some 40 s here), so that
# tests/test_tunix.py and notebook 10 compare the lab with it; without the extra they skip, saying why.
$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test,tunix]"
	touch $@ $(LAB_STAMP)

install-lab: $(LAB_STAMP)

install-test: $(TEST_STAMP)

# Jupyter refuses to run as root without --allow-root (containers and cloud boxes run as root);
# with no display it opens no browser and prints the URL (with its token) to open instead.
# The server's default address is notebook 00 itself: the URL it prints, and the page a
# browser opens with a display, is that notebook's, not the Launcher's.
LAB_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root) $(if $(DISPLAY)$(WAYLAND_DISPLAY),,--no-browser)
FIRST_NOTEBOOK := 00_start_here.ipynb

# JupyterLab serves working copies of the notebooks (rlcluster_lab/lab/notebook/copies.py), in LAB_DIR, which
# git ignores: running and saving a notebook leaves notebooks/ as committed. A copy is refreshed when
# its tracked notebook changed; one changed on both sides is kept beside it as NAME.backup-N.ipynb.
# The kernels get the tracked folder (RLCLUSTER_LAB_NOTEBOOKS): a notebook whose optional extra is
# missing shows the outputs committed with it (rlcluster_lab.lab.notebook.setup.needs_extra).
LAB_DIR ?= .lab/notebooks

# The warm start (rlcluster_lab/lab/notebook/warm.py): once per environment, a background process at the lowest
# CPU priority compiles the standard programs into the persistent cache while JupyterLab opens.
lab: install-lab
	-$(PY) -m rlcluster_lab.lab.notebook.warm --background
	$(PY) -m rlcluster_lab.lab.notebook.copies notebooks $(LAB_DIR)
	RLCLUSTER_LAB_NOTEBOOKS=$(CURDIR)/notebooks $(VENV)/bin/jupyter lab $(LAB_FLAGS) --ServerApp.root_dir=$(LAB_DIR) \
		--LabApp.default_url=/lab/tree/$(FIRST_NOTEBOOK)

# Two tiers. `make test-fast`: no cluster build, no subprocess, no notebook (about a minute on
# 2 cores) for the edit-and-test loop. `make test` (CI): everything, the notebooks under nbval, the
# real-browser test and the multi-process launch included. Both spread whole files over WORKERS
# processes (pytest-xdist), so a notebook's cells stay in order in one of them.
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist loadfile

test: install-test lint
	$(PY) -m pytest $(XDIST)

test-fast: install-test
	$(PY) -m pytest $(XDIST) -m "not cluster and not slow" -p no:nbval tests

# Our users' Python and JAX (Colab and Ubuntu 24.04 run Python 3.12; JAX 0.11 and later need it):
# the fast tier, every notebook, and the set-up cell keeping a runtime's older JAX (tests/test_install.py)
# on PYTHON_NEWEST with the newest JAX on the registry, in a venv of their own. .ci/run finds a Python
# 3.12 and runs this after `make test`.
PYTHON_NEWEST ?= python3.12
VENV_NEWEST ?= .venv-newest

test-newest:
	rm -rf $(VENV_NEWEST)
	$(PYTHON_NEWEST) -m venv $(VENV_NEWEST)
	$(VENV_NEWEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_NEWEST)/bin/python -m pip install --quiet --upgrade -e ".[test]" jax jaxlib
	$(VENV_NEWEST)/bin/python -c "import sys, jax; print('Python', sys.version.split()[0], 'with JAX', jax.__version__)"
	$(VENV_NEWEST)/bin/python -m pytest $(XDIST) -m "not cluster and not slow" -p no:nbval tests
	$(VENV_NEWEST)/bin/python -m pytest -p no:nbval tests/test_install.py
	$(VENV_NEWEST)/bin/python -m pytest $(XDIST) notebooks

# ruff (lint and format check) and import-linter (one-way layers, no cycle inside a subpackage),
# both configured in pyproject.toml; `make test` runs them first.
lint: install-test
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(VENV)/bin/ruff format --check src tests benchmarks notebooks
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache

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
