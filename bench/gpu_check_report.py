"""The GPU check's verdict and table: ratios against stock llama.cpp and against exact,
the paper's targets, exactness, and one line per configuration (printed last, so the
run's tail in a log is the result).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gpu_check_configs import FULL_LAYERS, PRESET, TARGET_QUALITY_VS_EXACT


class RunShape(NamedTuple):
    """What the table's heading says about the run."""

    tokens: int
    runs: int
    forced: int
    dry: bool
    gpu: str  # nvidia-smi's line for GPU 0, "GPU" when unknown


class Summary(NamedTuple):
    rows: list[dict[str, Any]]
    verdict: dict[str, Any]
    lines: list[str]


def summarize(model: dict[str, Any], bw: dict[str, Any], results: dict[str, dict[str, Any]],
              run: RunShape) -> Summary:
    """The rows, the verdict on the targets and the table, from every configuration's
    result (a failed or skipped one keeps its row, with its status)."""
    def tok(name: str) -> float | None:
        r = results.get(name, {})
        return r.get("tok_s") if r.get("tok_s") else None

    stock, exact = tok("stock"), tok("exact")
    rows = []
    for name, r in results.items():
        t = tok(name)
        rows.append({
            "config": name, "label": r.get("label", name), "tok_s": t,
            "vs_stock": t / stock if t and stock else None,
            "vs_exact": t / exact if t and exact else None,
            "hit_rate": r.get("hit_rate"), "substituted": r.get("substituted"),
            "mass_per_token": r.get("mass_per_token"),
            "fetched_mb_per_token": r.get("fetched_mb_per_token"),
            "sync_copy_ms_per_token": r.get("sync_copy_ms_per_token"),
            "gpu_mem_mib": r.get("gpu_mem_mib"), "threads": r.get("threads"),
            "n_tokens": r.get("n_tokens"),
            "max_abs_diff": r.get("max_abs_diff"),
            "bitwise_equal": r.get("bitwise_equal"),
            "top1_agreement": r.get("top1_agreement"),
            "status": r.get("error") or r.get("skipped") or "ok"})
    quality = tok("quality-first")
    verdict: dict[str, Any] = {
        "quality_vs_exact": quality / exact if quality and exact else None,
        "quality_vs_exact_target": TARGET_QUALITY_VS_EXACT,
        "quality_vs_stock": quality / stock if quality and stock else None,
        "exact_max_abs_diff": results.get("exact", {}).get("max_abs_diff"),
        "exact_bitwise_equal": results.get("exact", {}).get("bitwise_equal"),
    }
    verdict["quality_meets_2_5x_exact"] = (
        verdict["quality_vs_exact"] >= TARGET_QUALITY_VS_EXACT
        if verdict["quality_vs_exact"] is not None else None)
    verdict["quality_beats_stock"] = (verdict["quality_vs_stock"] > 1.0
                                      if verdict["quality_vs_stock"] is not None else None)

    lines = []
    gbps = bw.get("gbps", {})
    if gbps:
        lines.append(f"copy bandwidth ({bw.get('backend', '?')}): " + ", ".join(
            f"{k} {v:.1f} GB/s" for k, v in gbps.items()))
    buffers = sorted({r.get("expert_buffer") for r in results.values()
                      if r.get("expert_buffer")})
    if buffers:
        lines.append("experts in host memory: " + ", ".join(
            f"{b} ({'pinned' if b.endswith('_Host') else 'pageable'})" for b in buffers))
    psr = results.get("psr", {})
    if psr.get("prefetch_accuracy") is not None:
        lines.append(f"psr: {psr['prefetches_per_token']:.1f} prefetches/token, "
                     f"{psr['prefetch_accuracy']:.0%} of them routed to")
    if verdict["exact_max_abs_diff"] is not None:
        lines.append(
            f"exactness: exact vs {results['reference'].get('label')}: max |dlogit| = "
            f"{verdict['exact_max_abs_diff']:.3g}"
            f" ({'bitwise equal' if verdict['exact_bitwise_equal'] else 'NOT bitwise equal'},"
            f" {run.forced} teacher-forced tokens)")

    def yes(v: bool | None) -> str:
        return "n/a" if v is None else ("PASS" if v else "MISS")

    if verdict["quality_vs_exact"] is not None:
        lines.append(f"target quality-first >= {TARGET_QUALITY_VS_EXACT}x exact: "
                     f"{verdict['quality_vs_exact']:.2f}x "
                     f"{yes(verdict['quality_meets_2_5x_exact'])}")
    if verdict["quality_vs_stock"] is not None:
        lines.append(f"target quality-first faster than stock: "
                     f"{verdict['quality_vs_stock']:.2f}x "
                     f"{yes(verdict['quality_beats_stock'])}")
    where = "CPU, DRY RUN (numbers mean nothing)" if run.dry else run.gpu.split(",")[0]
    lines.append("")
    lines.append(
        f"GPU check [{where}]: {PRESET} synthetic model, {model['n_layers']} of "
        f"{FULL_LAYERS} layers, {model['n_expert']} experts top-{model['top_k']} "
        f"(hidden {model['n_embd']}, width {model['n_ff_exp']}, {model['expert_type']}),"
        f" decode {run.tokens} tokens, median of {run.runs} runs")
    head = (f"{'configuration':30s} {'tok/s':>8s} {'vs stock':>9s} {'vs exact':>9s} "
            f"{'hit':>5s} {'subst':>6s} {'VRAM':>7s} {'max|dlogit|':>11s}")
    lines.append(head)
    lines.append("-" * len(head))

    def f(v: float | None, spec: str, suffix: str = "") -> str:
        width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
        text = "-" if v is None else format(v, spec).strip() + suffix
        return text.rjust(width + len(suffix))

    for row in rows:
        if row["status"] != "ok":
            lines.append(f"{row['label']:30s} {row['status']}")
            continue
        mem = row["gpu_mem_mib"]
        diff = ("ref" if row["config"] == "reference"
                else f(row["max_abs_diff"], ".3g"))
        lines.append(
            f"{row['label']:30s} {f(row['tok_s'], '8.2f')} "
            f"{f(row['vs_stock'], '8.2f', 'x')} {f(row['vs_exact'], '8.2f', 'x')} "
            f"{f(row['hit_rate'], '5.0%')} {f(row['substituted'], '6.1%')} "
            f"{f(mem / 1024 if mem is not None else None, '6.1f', 'G')} {diff:>11s}")
    return Summary(rows, verdict, lines)

