"""The GPU check's dry run: bench/gpu_check.sh drives the same code on this CPU machine
(no CUDA build, the installed engine, a small model) so that the script, and the bundle
builder it depends on, do not rot between the rare runs on a GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from moescope.engine.bindings import is_patched

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ["reference", "stock", "exact", "quality-first", "speed-first", "psr", "vulkan"]

needs_engine = pytest.mark.skipif(not is_patched(),
                                  reason="the patched engine is not installed (make engine)")


def _run(argv: list[str], env: dict[str, str] | None = None,
         timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _quick_bundle(dest: Path) -> Path | None:
    """A --quick bundle (no wheels, no CMake); None when the sdist is not cached here."""
    made = _run([sys.executable, str(REPO / "bench" / "make_gpu_bundle.py"), "--quick",
                 "--out", str(dest)], timeout=120)
    if made.returncode == 3:  # the engine came from the wheel cache; no sdist to trim
        return None
    assert made.returncode == 0, made.stdout + made.stderr
    return dest


def _dry_run(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OUT=str(tmp / "out"), PYTHON=sys.executable)
    env.pop("GPU_CHECK_T0", None)
    return _run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--dry-run", "--work",
                 str(tmp / "work"), *extra], env=env)


def test_trim_keeps_what_cmake_needs_and_drops_the_rest() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from make_gpu_bundle import keep
    finally:
        sys.path.remove(str(REPO / "bench"))

    def k(path: str, is_dir: bool = False) -> bool:
        return keep(PurePosixPath(path), is_dir)

    assert k("CMakeLists.txt") and k("llama_cpp/llama_cpp.py")
    assert k("vendor/llama.cpp/src/llama-graph.cpp")
    assert k("vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu")
    assert k("vendor/llama.cpp/ggml/src/ggml-cpu", is_dir=True)
    assert k("vendor/llama.cpp/ggml/src/ggml-backend.cpp")  # a file, not a backend
    assert k("vendor/llama.cpp/vendor/miniaudio/miniaudio.h")  # add_subdirectory'd
    assert not k(".git/HEAD") and not k("docs/index.md") and not k("tests/test_llama.py")
    assert not k("llama_cpp/lib/libllama.so")
    assert not k("vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf")
    assert not k("vendor/llama.cpp/tools/server/server.cpp")
    assert k("vendor/llama.cpp/ggml/src/ggml-vulkan", is_dir=True)  # the Vulkan row
    assert not k("vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal.m")
    assert not k("vendor/llama.cpp/vendor/cpp-httplib/httplib.h")


@needs_engine
@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dry_run_measures_every_configuration_and_prints_the_table_last(
        tmp_path: Path) -> None:
    bundle = _quick_bundle(tmp_path / "bundle")
    proc = _dry_run(tmp_path, *(["--bundle", str(bundle)] if bundle else []))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rows = report["rows"]
    assert [r["config"] for r in rows] == CONFIGS
    for row in rows:
        if row["config"] == "vulkan":  # built and run on a GPU machine only
            assert row["status"] == "skipped: a GPU run only", row
            continue
        assert row["status"] == "ok" and row["tok_s"] > 0, row
        assert row["n_tokens"] == 16
    by = {r["config"]: r for r in rows}
    assert by["stock"]["vs_stock"] == pytest.approx(1.0)
    assert by["exact"]["vs_exact"] == pytest.approx(1.0)
    assert by["quality-first"]["substituted"] > 0  # the policy did substitute
    # the dry run of the exactness check: same kernels, so bitwise equal (as on the GPU)
    assert report["verdict"]["exact_bitwise_equal"] is True
    assert report["verdict"]["exact_max_abs_diff"] == 0.0
    assert report["bandwidth"]["gbps"]
    if bundle is not None:  # the archive's llama_cpp ran on the installed library
        assert report["bundle"]["source_key"] == report["bundle"]["repo_source_key"]
        assert "+moescope.gpu." in report["configs"]["exact"]["engine_version"]

    table = (tmp_path / "out" / "gpu_check_table.txt").read_text().splitlines()
    printed = proc.stdout.rstrip().splitlines()
    assert printed[-len(table):] == table  # the table is the last thing printed
    n = len(rows)
    assert table[-n - 2].startswith("configuration") and "vs stock" in table[-n - 2]
    assert [line.split("  ")[0] for line in table[-n:]] == [r["label"] for r in rows]
    assert report["configs"]["psr"]["prefetches_per_token"] > 0  # PSR prefetched here too
    assert any(line.startswith("experts in host memory: CPU") for line in table)


@pytest.mark.slow
def test_a_stale_bundle_is_refused(tmp_path: Path) -> None:
    bundle = _quick_bundle(tmp_path / "bundle")
    if bundle is None:
        pytest.skip("the llama-cpp-python sdist is not cached")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["source_key"] = "0" * 16
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    proc = _dry_run(tmp_path, "--bundle", str(bundle))
    assert proc.returncode != 0
    assert "make gpu-bundle" in proc.stdout + proc.stderr
