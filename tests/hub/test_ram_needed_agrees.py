"""One "RAM needed" for one model, context and budget (new-user review: the Open dialog
said 24.7 MiB, ``moescope info`` 277.1 MiB, for the demo model): the fit the Open dialog
and ``pull`` show and ``info``'s memory line are the same figure, the weights kept in
RAM, the KV cache for the context, slots in host memory and working buffers
(``model.ram_fit.host_bytes_needed``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hub_helpers import BIG_REPO, REPO, Hub

from moescope.cache.budget import format_bytes, plan_for_model
from moescope.cli import main
from moescope.display.fit import estimate_fit
from moescope.model.gguf_info import read_model_info
from moescope.model.ram_fit import RESERVE, host_bytes_needed, kv_cache_bytes


def _info_needs(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["info", *argv]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("memory"))
    m = re.search(r"needs about (\S+ \S+) with a (\d+)-token context", line)
    assert m is not None, line
    return f"{m[1]} @ {m[2]}"


def _pull_needs(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(["pull", *argv, "--check"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"RAM needed (\S+ \S+):", out)
    assert m is not None, out
    return m[1]


@pytest.mark.parametrize(("repo", "file", "key"), [(BIG_REPO, "Big-MoE-Q4_0.gguf", "big"),
                                                   (REPO, "Tiny-MoE-Q8_0.gguf", "tiny")])
@pytest.mark.parametrize(("budget", "ctx"), [("25%", "4096"), ("50%", "256"), (None, None)])
def test_info_pull_and_the_open_dialog_need_the_same_ram(
        hub: Hub, capsys: pytest.CaptureFixture[str], repo: str, file: str, key: str,
        budget: str | None, ctx: str | None) -> None:
    path: Path = getattr(hub, key)
    options = [*(["--budget", budget] if budget else []), *(["--ctx", ctx] if ctx else [])]
    pulled = _pull_needs(capsys, [f"{repo}:{file}", *options])
    said = _info_needs(capsys, [str(path), *options])
    info = read_model_info(path)
    n_ctx = min(int(ctx or 4096), info.context_length or 1 << 30)
    fit = estimate_fit(info, budget or "25%", int(ctx or 4096))  # what the dialog shows
    assert fit.n_ctx == n_ctx
    dialog = dict(fit.lines())["RAM needed"]
    assert said == f"{pulled} @ {n_ctx}"
    assert dialog.startswith(f"{pulled} with the KV cache and 256.0 MiB of working buffers")


def test_the_fit_counts_weights_kv_cache_slots_and_working_buffers(hub: Hub) -> None:
    info = read_model_info(hub.tiny)
    fit = estimate_fit(info, "50%", 256, backend="cpu", device=None)
    slots = plan_for_model(info, "50%").bytes_used
    assert fit.ram_needed == (info.non_expert_bytes + info.total_expert_bytes
                              + kv_cache_bytes(info, 256) + slots + RESERVE)
    assert fit.ram_needed == host_bytes_needed(info, 256, slots)
    # a RAM tier keeps fewer experts in RAM: the rest is not needed in memory
    tier = estimate_fit(info, "50%", 256, ram_budget="25%", backend="cpu", device=None)
    assert fit.ram_needed - tier.ram_needed == tier.disk_expert_bytes > 0
    assert tier.ram_needed == host_bytes_needed(info, 256, slots, tier.ram_expert_bytes)
    # the context is the model's at most, as the engine loads it
    longest = info.context_length
    assert estimate_fit(info, "50%", longest * 4).ram_needed == \
        estimate_fit(info, "50%", longest).ram_needed
    assert format_bytes(fit.ram_needed) in dict(fit.lines())["RAM needed"]
