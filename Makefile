# gpuprov: the two commands of the Quick start are `make demo` and `make test`.
# Every target installs what it needs first (Debian packages, the virtualenv), so both work
# on a fresh Debian 12 machine as root.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# podman works on these machines only with the repo's settings; never the machine's /etc.
export CONTAINERS_CONF := $(CURDIR)/gpuprov/lab/image/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)

LAB_INVENTORY := inventory/lab/hosts.yml

.PHONY: help deps venv containerd-bins docs demo lab-up lab-down test test-unit test-lab test-molecule lint bench clean

help:
	@echo "make demo   set everything up, bring up the 4-node lab, run site.yml on it"
	@echo "make test   set everything up and run every test (unit, lint, lab)"
	@echo "make lab-down   remove the demo lab"
	@echo "make bench  run the benchmarks in bench/ (figures against a baseline of the same run)"

deps:
	@bash scripts/install-system-deps.sh

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: deps $(VENV)/.installed

# Into the machine's cache (gpuprov/lab/cache.py), not installed: Debian's containerd 1.6 /
# 1.7 / 2.x binaries (<cache>/containerd/<suite>/) for the unit tests that run `containerd config dump` on the merged runtime configs, the CRI's
# api.proto the lab's kubelet is generated from, gnostic's OpenAPIv2.proto (the emulated API's
# /openapi/v2) and Debian's kubectl (<cache>/containerd/kubectl/usr/bin/kubectl), the real
# client the lab is tested with.
containerd-bins:
	@bash scripts/fetch-containerd.sh

# Each role's README "Role variables" table, from its meta/argument_specs.yml (the one
# description of a variable; tests/unit/test_role_docs.py fails when they disagree).
docs: venv
	python scripts/role_docs.py

lab-up: venv containerd-bins
	gpuprov lab up

demo: lab-up
	ansible-playbook -i $(LAB_INVENTORY) site.yml
	gpuprov verify -i $(LAB_INVENTORY)

lab-down: venv
	gpuprov lab down

lint: venv
	ruff check gpuprov tests plugins bench scripts
	yamllint -s .
	ansible-lint

# pytest-xdist: the unit tests spread over the workers; each lab (the session lab, and each
# module's own lab) is one group that runs whole in one worker (tests/conftest.py), so the
# labs run side by side. Every run lists its slowest tests and fixture setups (--durations)
# and each lab's `lab up` and playbook runs (tests/timings.py), for the CI log.
TEST_WORKERS ?= 4
DURATIONS := --durations=40 --durations-min=5
XDIST := -n $(TEST_WORKERS)

test-unit: venv containerd-bins
	pytest -n 2 $(DURATIONS) -m "not lab and not molecule" tests

test-lab: venv containerd-bins
	pytest $(XDIST) $(DURATIONS) -m lab tests

test-molecule: venv
	pytest $(XDIST) -m molecule tests

# Molecule scenarios whose every assertion a lab test makes on the converged session lab
# (molecule/README.md maps each one): `make test-molecule` still runs them.
COVERED_BY_LAB := --deselect tests/molecule/test_nvidia_driver.py::test_molecule_nvidia_driver

# One pytest run, so the summary line counts every test; lint runs beside it (its output
# follows pytest's), at a low priority (it is done long before the tests), and fails the
# target too.
test: venv containerd-bins
	@nice -n 10 $(MAKE) --no-print-directory lint > .lint.log 2>&1 & lint=$$!; \
	rc=0; pytest $(XDIST) $(DURATIONS) $(COVERED_BY_LAB) tests || rc=$$?; \
	lint_rc=0; wait $$lint || lint_rc=$$?; \
	echo "== make lint (exit $$lint_rc)"; cat .lint.log; rm -f .lint.log; \
	exit $$(( rc != 0 ? rc : lint_rc ))

# Figures for the notes; each script prints its baseline measured in the same run.
bench: venv
	python bench/lab_up.py
	python bench/kube_list_nodes.py
	python bench/verify_fanout.py
	python bench/site_playbook.py

clean: lab-down
	rm -rf $(VENV) .pytest_cache .ruff_cache
