# The two commands: `make run` (the lab) and `make test` (setup + the whole suite).
PY := .venv/bin/python
.PHONY: setup run test lint clean smoke

setup:
	bash scripts/setup.sh

run: setup
	$(PY) -m lab.run_main

test: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy
	$(PY) -m pytest -q -n 2 --durations=30 -m "not full" tests  # two workers (tests/conftest.py groups them); full runs too: scripts/test-full

# The CLI walk-through against a GPU-less fabricd (FABRIC_DRY_RUN=1); also part of `make test`.
smoke: setup
	$(PY) scripts/smoke-dry-run

lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy
	shellcheck scripts/*.sh

clean:
	rm -rf .venv .state
