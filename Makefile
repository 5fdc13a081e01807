# MoEScope — one entry point for users, developers and CI.
#   make run    set everything up (venv, pinned packages, engine) and open the app
#   make test   set everything up and run every test (native + Python, Qt offscreen)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_PIN := pip==25.3
DEPS_STAMP := $(VENV)/.moescope-deps
DIST_STAMP := $(VENV)/.moescope-dist-deps
NATIVE_BUILD := build/native
export MOESCOPE_CACHE ?= $(HOME)/.cache/moescope

.PHONY: FORCE setup deps engine engine-cuda-configure native test test-native test-python lint \
        run bench fuzz gpu-bundle screenshot clean install-desktop uninstall-desktop dist dist-smoke

setup: deps native engine

# A venv whose python is gone (deleted, or a dangling link after a Python upgrade) or that
# has no pip (venv creation interrupted, or python3-venv was missing) is made again.
deps: $(DEPS_STAMP)
$(DEPS_STAMP): pyproject.toml constraints.txt $(if $(shell test -x $(PY) && echo ok),,FORCE)
	@command -v $(PYTHON) >/dev/null || { echo "python3 not found: sudo apt-get install python3 python3-venv"; exit 2; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "MoEScope needs Python >= 3.10"; exit 2; }
	@$(PY) -c 'import pip' 2>/dev/null || { test ! -e $(VENV) -o -f $(VENV)/pyvenv.cfg || { echo "$(VENV) is not a venv: remove it"; exit 2; }; \
	    $(PYTHON) -m venv --clear $(VENV) || { echo "could not create a venv: sudo apt-get install python3-venv"; exit 2; }; }
	$(PY) -m pip install --quiet $(PIP_PIN)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

# The patched llama-cpp-python wheel with the native core compiled in; cached by input hash.
engine: deps
	$(PY) engine_patch/build_engine.py --venv $(VENV)

# Checks the CUDA path up to CMake configuration (a full CUDA build takes ~45 min on 2 cores).
engine-cuda-configure: deps
	MOESCOPE_CUDA=1 $(PY) engine_patch/build_engine.py --configure-only

native:
	@command -v cmake >/dev/null || { echo "cmake not found: sudo apt-get install cmake"; exit 2; }
	@command -v $${CXX:-c++} >/dev/null || { echo "no C++ compiler ($${CXX:-c++}): sudo apt-get install g++"; exit 2; }
	@cmake -S native -B $(NATIVE_BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(NATIVE_BUILD) -j2

test: setup test-native lint test-python

test-native: native
	ctest --test-dir $(NATIVE_BUILD) --output-on-failure

test-python: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

run: setup
	$(VENV)/bin/moescope

# A launcher in the desktop's application menu for this checkout (~/.local/share, no root).
install-desktop: setup
	$(PY) packaging/install_desktop.py

uninstall-desktop:
	$(PY) packaging/install_desktop.py --uninstall

# The desktop bundle dist/MoEScope/ (PyInstaller one-dir), then its smoke test: the frozen
# app's info, generate and --self-test (docs/building.md). PyInstaller comes from the
# optional "dist" extra, so `make test` never installs it.
dist: setup $(DIST_STAMP)
	$(PY) packaging/build_bundle.py

dist-smoke: deps
	$(PY) packaging/build_bundle.py --smoke-only

$(DIST_STAMP): $(DEPS_STAMP) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dist]'
	@touch $@

bench: setup
	$(PY) bench/engine_bench.py

# The long fuzz campaign (issue 14): 10,000 generated GGUF files and traces and 1,000
# argument vectors against info, generate, chat and replay, each in a limited fork;
# prints a table of outcomes and keeps failing inputs under build/fuzz/.
fuzz: setup
	$(PY) bench/fuzz_campaign.py

# A self-contained folder (bundle/) for the GPU check on a machine without network.
gpu-bundle: deps
	$(PY) bench/make_gpu_bundle.py

# The README's screenshot: the real window under a virtual X server, mid-generation.
screenshot: setup
	@command -v xvfb-run >/dev/null || { echo "xvfb-run not found: sudo apt-get install xvfb"; exit 2; }
	xvfb-run -a -s "-screen 0 1600x1000x24" $(PY) packaging/screenshot.py docs/screenshot.png

clean:
	rm -rf $(NATIVE_BUILD) build/pyinstaller dist .pytest_cache .ruff_cache

FORCE:
