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
TEST_SUMMARY := build/test-summary.txt
VULKAN_PACKAGES := mesa-vulkan-drivers glslc libvulkan-dev spirv-headers
# On the Vulkan build: every engine test, and the GUI's end-to-end smoke test and backend line.
VULKAN_TESTS := tests/engine tests/gui/test_self_test.py::test_self_test_passes_and_prints_one_ok_line \
    tests/gui/test_window.py::test_memory_view_says_where_the_slots_are_and_why \
    tests/gui/test_window.py::test_about_lists_engine_commit_and_gpu
export MOESCOPE_CACHE ?= $(HOME)/.cache/moescope

.PHONY: FORCE setup deps engine engine-cuda-configure native test test-native test-python test-vulkan lint \
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
# MOESCOPE_BACKEND=auto (default: CUDA, else Vulkan on a hardware GPU, else CPU) | cpu | cuda | vulkan
engine: deps
	$(PY) engine_patch/build_engine.py --venv $(VENV)

# Checks the CUDA path up to CMake configuration (a full CUDA build takes ~45 min on 2 cores).
engine-cuda-configure: deps
	MOESCOPE_BACKEND=cuda $(PY) engine_patch/build_engine.py --configure-only

native:
	@command -v cmake >/dev/null || { echo "cmake not found: sudo apt-get install cmake"; exit 2; }
	@command -v $${CXX:-c++} >/dev/null || { echo "no C++ compiler ($${CXX:-c++}): sudo apt-get install g++"; exit 2; }
	@cmake -S native -B $(NATIVE_BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(NATIVE_BUILD) -j2

test: setup test-native lint test-python test-vulkan
	@echo "== tests per backend ==" && cat $(TEST_SUMMARY)

test-native: native
	ctest --test-dir $(NATIVE_BUILD) --output-on-failure

test-python: setup
	@mkdir -p build && rm -f $(TEST_SUMMARY)
	QT_QPA_PLATFORM=offscreen MOESCOPE_TEST_SUMMARY=$(TEST_SUMMARY) $(PY) -m pytest -q

# The engine tests again on the Vulkan build (cached like the others; its libraries are loaded
# through LLAMA_CPP_LIB_PATH beside the venv's engine) over Mesa's lavapipe, a software Vulkan
# device that ggml hides unless GGML_VK_VISIBLE_DEVICES names it: slots in a real device's
# memory on any machine; correctness, not speed. MOESCOPE_REQUIRE_VULKAN=1 (CI) fails instead
# of skipping when the packages are missing.
test-vulkan: setup
	@set -o pipefail; mkdir -p build; \
	if ! command -v glslc >/dev/null || [ ! -e /usr/include/vulkan/vulkan.hpp ] || \
	   [ ! -d /usr/include/spirv/unified1 ] || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then \
	    msg="Vulkan engine tests skipped: sudo apt-get install $(VULKAN_PACKAGES)"; \
	    echo "$$msg"; echo "$$msg" >> $(TEST_SUMMARY); test -z "$$MOESCOPE_REQUIRE_VULKAN"; exit; fi; \
	lib=$$(MOESCOPE_BACKEND=vulkan $(PY) engine_patch/build_engine.py --lib-dir | tee -a /dev/stderr | tail -n 1) || exit 2; \
	echo "LLAMA_CPP_LIB_PATH=$$lib GGML_VK_VISIBLE_DEVICES=0 pytest $(VULKAN_TESTS)"; \
	LLAMA_CPP_LIB_PATH=$$lib GGML_VK_VISIBLE_DEVICES=0 QT_QPA_PLATFORM=offscreen \
	    MOESCOPE_TEST_SUMMARY=$(TEST_SUMMARY) $(PY) -m pytest -q -p no:cacheprovider $(VULKAN_TESTS)

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

# The README's screenshots: the real window under a virtual X server, mid-generation, on a
# full-HD screen and on a small laptop's 1024x700.
screenshot: setup
	@command -v xvfb-run >/dev/null || { echo "xvfb-run not found: sudo apt-get install xvfb"; exit 2; }
	xvfb-run -a -s "-screen 0 1920x1080x24" $(PY) packaging/screenshot.py docs/screenshot.png --size 1920x1080
	xvfb-run -a -s "-screen 0 1920x1080x24" $(PY) packaging/screenshot.py docs/screenshot-1024x700.png --size 1024x700

clean:
	rm -rf $(NATIVE_BUILD) build/pyinstaller dist .pytest_cache .ruff_cache

FORCE:
