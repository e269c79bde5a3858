# The two commands a fresh clone needs: `make demo` and `make test`.
# Each creates .venv if missing, installs $(TORCH_SPEC) when no torch is present, installs
# marlkit with its dependencies, then runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A bare `torch` requirement can resolve to a multi-GB CUDA build: torch is installed first, from
# pip's configured index (here it serves the CPU build); where that index serves CUDA builds (PyPI
# on Linux), point TORCH_INDEX at https://download.pytorch.org/whl/cpu.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.marlkit-installed
# Headless rendering (MuJoCo through EGL) needs these Debian packages; installed when apt-get exists.
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
# EGL through glvnd, with Mesa's software rasteriser (llvmpipe) where there is no GPU.
GL_DEBS ?= libegl1 libgl1 libopengl0 libegl-mesa0 libgl1-mesa-dri

.PHONY: install system-deps meltingpot-substrates demo test test-fast lint bench clean

# Idempotent and quiet: installs only the missing packages, with sudo unless root; a no-op
# where dpkg/apt-get do not exist (not Debian); a failed install warns and goes on.
system-deps:
	@if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; \
	  for p in $(GL_DEBS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    echo "installing$$missing (headless rendering)"; \
	    { $$sudo apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } || \
	    echo "warning: could not install$$missing; MuJoCo rendering needs them (apt-get install$$missing)" >&2; \
	  fi; \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/include/marlkit/*.h) | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[dev]"
	@touch $(STAMP)

# MeltingPot substrates for the meltingpot adapter: NOT a full dm-meltingpot install. Its only
# release is an sdist whose build downloads its assets (meltingpot-assets-*.tar.gz: the
# scenarios' bots, TensorFlow saved models) from storage.googleapis.com, which these machines
# cannot reach, and which requires tensorflow (1.6 GB), which substrates never import. So, only
# when meltingpot is not importable: the substrates' dependencies come from the registry, and the
# sdist is built with --no-deps against an empty assets tarball, placed where its setup.py looks
# for a cached download (tempfile.gettempdir(), here a private TMPDIR). Substrates run; scenarios
# (their bots) stay unavailable. Where the assets URL is reachable, use pip install dm-meltingpot.
MELTINGPOT_SPEC ?= dm-meltingpot==2.4.1
MELTINGPOT_ASSETS ?= meltingpot-assets-2.3.0.tar.gz
MELTINGPOT_DEPS ?= dmlab2d dm-env dm-tree immutabledict ml-collections reactivex chex absl-py networkx

meltingpot-substrates: $(STAMP)
	@if ! $(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('meltingpot') is None)"; then \
	  echo "installing $(MELTINGPOT_SPEC) substrates only (no assets, no tensorflow: see Makefile)"; \
	  tmp=$$(mktemp -d) && mkdir -p $$tmp/empty/assets && \
	  tar -czf $$tmp/$(MELTINGPOT_ASSETS) -C $$tmp/empty assets && \
	  $(PIP) install -q $(MELTINGPOT_DEPS) && \
	  TMPDIR=$$tmp $(PIP) install -q --no-deps "$(MELTINGPOT_SPEC)"; \
	  status=$$?; rm -rf $$tmp; exit $$status; \
	fi

install: system-deps $(STAMP) meltingpot-substrates

# Trains MAPPO on native navigation (about three minutes on 2 cores) and writes runs/<timestamp>/:
# metrics.csv, reward.png, rollout.mp4 (the trained policy), summary.json (trained vs random).
demo: install
	$(PY) sota-implementations/mappo_ippo/mappo_ippo.py --config-name demo

LINT_PATHS := $(wildcard platform adapters scenarios tests benchmarks sota-implementations) setup.py

lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	@# import-linter cannot follow the import hook of the lenient editable install in .venv
	@# (package-dir maps adapters/ and scenarios/ into marlkit). A strict editable install,
	@# kept out of .venv (--target) and without the extension, builds setuptools' link tree
	@# of the installed layout (build/__editable__.marlkit-*/marlkit, symlinks to the
	@# sources), and the contracts are checked on it.
	rm -rf build/lint-site build/__editable__.marlkit-* && mkdir -p build
	MARLKIT_NO_EXTENSION=1 $(PIP) install -q --no-deps --no-build-isolation \
	  --config-settings editable_mode=strict --target build/lint-site -e . 2>build/lint-install.log \
	  || { cat build/lint-install.log >&2; exit 1; }
	cd build/__editable__.marlkit-*/ && ../../$(VENV)/bin/lint-imports --no-cache ../../pyproject.toml
	@# mypy on the same tree: the package as installed, adapters and scenarios included.
	cd build/__editable__.marlkit-*/ && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml \
	  --cache-dir ../mypy-cache -p marlkit

# The suite runs on TEST_WORKERS processes (pytest-xdist): most tests spend their time waiting
# on worker processes, simulators or compilers. The tests that start a Ray share one process
# (tests/conftest.py: one local Ray at a time); the `serial` tests, which count machine-wide
# resources, run alone afterwards. TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2

test: lint
	$(PY) -m pytest -x -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not serial"
	$(PY) -m pytest -x -q -p no:cacheprovider -m serial

test-fast: install
	$(PY) -m pytest -x -q -n $(TEST_WORKERS) -m "not slow and not serial"
	$(PY) -m pytest -x -q -m "serial and not slow" || [ $$? -eq 5 ]  # 5: none selected

bench: install
	$(PY) benchmarks/env_step.py

clean:
	rm -rf build dist *.egg-info platform/*.egg-info platform/marlkit/_C*.so .pytest_cache
