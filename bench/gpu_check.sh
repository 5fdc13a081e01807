#!/usr/bin/env bash
# GPU check: build the patched engine with CUDA (sm_90) from bundle/ and measure decode
# speed of stock llama.cpp (-ot exps=CPU) and MoEScope's expert cache, plus exactness and
# copy bandwidth; the table comes last, JSON goes to $OUT when set. Everything is in
# bench/gpu_check.py (--help); this wrapper only picks the Python and starts the clock.
#
#   make gpu-bundle                      # here, with network: prepares bundle/
#   bash bench/gpu_check.sh              # on the GPU machine (no network needed)
#   bash bench/gpu_check.sh --dry-run    # any CPU machine: same driver, tiny sizes
set -euo pipefail
export GPU_CHECK_T0="${GPU_CHECK_T0:-$(date +%s.%N)}"
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    # the project's venv on a development machine; the machine's python3 (the one with
    # PyTorch) on the GPU machine, where .venv does not travel
    if [[ -x "$here/../.venv/bin/python" && " $* " == *" --dry-run "* ]]; then
        py="$here/../.venv/bin/python"
    else
        py="$(command -v python3 || command -v python)"
    fi
fi
exec "$py" "$here/gpu_check.py" "$@"
