# The two commands of the README: `make demo` and `make test`. Both set up everything
# they need in .venv on first use (torch pinned to the 2.13.0 CPU wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit docs docsbuild bench clean

# Azurite (npm) serves Azure Blob to the tests; installed locally, pinned, next to the venv.
AZURITE_VERSION := 3.37.0
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt "torch==2.13.0" -e ".[dev]"
	test -x $(AZURITE) || npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error \
		azurite@$(AZURITE_VERSION)
	touch $(STAMP)

# The Iceberg demo is a dev module at the repository root (it writes delete files through
# private pyiceberg APIs, so it is not shipped in the package); `python -m` finds it from here.
demo: $(STAMP)
	$(PY) -m torch_dataloader_utils demo
	$(PY) -m testsupport.demo_iceberg

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks testsupport
	$(VENV)/bin/ruff format --check src tests benchmarks testsupport

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -n 2 --durations=15

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

docsbuild: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: lint typecheck unit docsbuild

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache .hypothesis demo_data
