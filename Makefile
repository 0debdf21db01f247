# FleetWatch: `make demo` runs the product, `make test` runs the whole suite. Both set up what
# they need on a fresh machine (a .venv, the package, a local PostgreSQL for the tests).

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.fleetwatch-installed
PYTEST_ARGS ?=
# Test workers (pytest-xdist). The live tests spend most of their time waiting on real servers,
# agents, PostgreSQL and slurmctld, so three workers finish well ahead of one even on two cores;
# worksteal: a worker that runs out takes tests from one still busy, so the live tests (listed
# first) do not all queue behind one worker. TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 3
# Real parts the tests drive: promtool, Alertmanager, headless Chromium, pdftoppm, WeasyPrint's
# native libraries, podman, runc and mmdebstrap (the container image).
IMAGE_DEBS = podman runc mmdebstrap
TEST_DEBS = prometheus prometheus-alertmanager chromium poppler-utils weasyprint fonts-dejavu-core \
	$(IMAGE_DEBS)
# `make image`: the container image as an OCI archive (`podman load -i` / `docker load -i`);
# IMAGE_FORMAT=docker-archive keeps the HEALTHCHECK, which the OCI format has no field for.
IMAGE_ARCHIVE ?= var/fleetwatch-image.oci.tar
IMAGE_FORMAT ?= oci-archive

.PHONY: demo test lint docs typecheck check bench fleet-scale install image clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "FleetWatch needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetwatch demo $(DEMO_ARGS)

# PostgreSQL, Slurm and the Debian tools are not optional here: FLEETWATCH_REQUIRE_POSTGRES,
# FLEETWATCH_REQUIRE_SLURM and FLEETWATCH_REQUIRE_TOOLS turn "not available" into a failure
# instead of a skip. helm is optional where it cannot be built (no Go module proxy): the chart's tests
# then skip, saying so; FLEETWATCH_REQUIRE_HELM=1 makes that a failure.
test: $(STAMP)
	scripts/ensure-postgres.sh
	scripts/ensure-slurm.sh
	scripts/ensure-debs.sh $(TEST_DEBS)
	@scripts/ensure-helm.sh >/dev/null || echo "make test: no helm: the Helm chart's tests skip (scripts/ensure-helm.sh)"
	FLEETWATCH_REQUIRE_POSTGRES=1 FLEETWATCH_REQUIRE_SLURM=1 FLEETWATCH_REQUIRE_TOOLS=1 \
		$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(MKDOCS) build --site-dir var/docs-lint

# The documentation site (mkdocs.yml) into site/; strict: a broken link or anchor fails the build.
# Open site/index.html, or serve it for search: $(BIN)/python -m http.server -d site.
# NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2.0, printed on every build. Never --quiet:
# mkdocs 1.6 then counts no warnings, and --strict passes a broken link.
MKDOCS = NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs
docs: $(STAMP)
	$(MKDOCS) build

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

bench: $(STAMP)
	scripts/ensure-postgres.sh
	$(BIN)/python benchmarks/ingest.py

# Issue 12: 12,500 simulated agents (100,000 GPUs) for 10 minutes against the server on PostgreSQL,
# Prometheus beside it; FLEET_SCALE_ARGS="--duration 60 --nodes 500" is the smoke run.
fleet-scale: $(STAMP)
	scripts/ensure-postgres.sh
	scripts/ensure-debs.sh prometheus
	$(BIN)/python benchmarks/fleet_scale.py $(FLEET_SCALE_ARGS)

# Without a registry: the Debian base from Debian's mirrors (mmdebstrap, cached in
# ~/.cache/fleetwatch/image), then the Dockerfile's own steps (scripts/build-image.sh).
image:
	scripts/ensure-debs.sh $(IMAGE_DEBS)
	scripts/build-image.sh --archive $(IMAGE_ARCHIVE) --format $(IMAGE_FORMAT)

clean:
	rm -rf $(VENV) var site .pytest_cache .mypy_cache .ruff_cache
