# The two commands of the README: `make demo` and `make test`. Both set up what they need
# in .venv on first use (torch pinned to the 2.13.0 CPU wheel): `make demo` the package
# with the one extra its demo uses (iceberg), `make test` the dev tools on top of it.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed-stamp
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt "torch==2.13.0"

.PHONY: demo test quick lint typecheck unit docs docsbuild bench clean

# Azurite (npm) serves Azure Blob to the tests; installed locally, pinned, next to the venv.
AZURITE_VERSION := 3.37.0
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob

$(DEMO_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) -e ".[iceberg]"
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP) pyproject.toml constraints.txt
	$(PIP) -e ".[dev]"
	test -x $(AZURITE) || npm install --prefix $(VENV)/azurite --no-audit --no-fund --loglevel=error \
		azurite@$(AZURITE_VERSION)
	touch $(STAMP)

# The Iceberg demo is a dev module at the repository root (it writes delete files through
# private pyiceberg APIs, so it is not shipped in the package); `python -m` finds it from here.
demo: $(DEMO_STAMP)
	$(PY) -m torch_dataloader_utils demo
	$(PY) -m testsupport.demo_iceberg

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks testsupport
	$(VENV)/bin/ruff format --check src tests benchmarks testsupport

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Test tiers (tests/conftest.py): launch, store and slow. A test with none of them whose
# call takes more than TIER_BUDGET CPU seconds is listed, and the slowest of each tier are
# printed. One over TIER_FAIL fails the run: the budget itself in `make quick`, a margin
# in `make test` (CI), since CPU seconds differ between machines and under load.
TIER_BUDGET ?= 2
TIER_FAIL ?= 10

unit: $(STAMP)
	$(VENV)/bin/pytest -n 2 --durations=15 --tier-budget $(TIER_BUDGET) --tier-budget-fail $(TIER_FAIL)

# The fast part alone: every test but the launch, store and slow tiers, with fewer
# Hypothesis examples (the quick profile). `make test` still runs the whole suite.
quick: $(STAMP)
	HYPOTHESIS_PROFILE=quick $(VENV)/bin/pytest -n 2 -m "not launch and not store and not slow" \
		--tier-budget $(TIER_BUDGET) --tier-budget-fail $(TIER_BUDGET)

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

docsbuild: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: lint typecheck unit docsbuild

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache .hypothesis demo_data
