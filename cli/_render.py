"""Rich rendering of library results. Only the CLI prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ardiff.sizes import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ardiff.engine.build import SpecReport

console = Console()


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=bool(columns))
    for column in columns or ("", ""):
        table.add_column(column)
    return table


def print_spec_report(report: SpecReport) -> None:
    spec, eff, plan = report.declared, report.effective, report.plan
    geometry = _table("Geometry")
    for name in ("num_layers", "num_kv_heads", "head_size", "tokens_per_frame",
                 "frames_per_block", "max_model_len", "max_scratch_tokens_per_branch"):
        geometry.add_row(name, str(getattr(spec, name)))
    branches = _table("Branches", "name", "local_index")
    for branch in spec.kv_branches:
        branches.add_row(branch.name, str(branch.local_index))
    cross = _table("Cross-attention caches", "name", "num_tokens")
    for cache in spec.cross_attention:
        cross.add_row(cache.name, str(cache.num_tokens))
    window = _table("Window", "", "declared", "effective")
    window.add_row("window_frames", str(spec.window_frames), str(eff.window_frames))
    window.add_row("sink_frames", str(spec.sink_frames), str(eff.sink_frames))
    window.add_row("policy", _policy(spec.reset_at_boundary), _policy(eff.reset_at_boundary))
    window.add_row("frames a block attends to", "", str(report.visible_frames_per_block))
    window.add_row("frames kept per branch", "", str(plan.history_frames_per_branch))
    console.print(geometry, branches)
    if spec.cross_attention:
        console.print(cross)
    console.print(window, _memory_table(report))
    if report.weights is not None:
        console.print(_weights_table(report))
    if report.model_layout is not None:
        console.print(f"model folder: {report.model_layout} layout", soft_wrap=True)
    if report.weights is None:
        console.print("fit: no verdict: weights not declared (the pipeline has no "
                      "weight_bytes), so what they take is unknown", soft_wrap=True)
    elif report.fit is not None:
        console.print(*_fit_lines(report), sep="\n", soft_wrap=True)
    else:
        console.print("fit: unknown; give --device-memory SIZE (e.g. 24GiB) to check a device",
                      soft_wrap=True)


def _weights_table(report: SpecReport) -> Table:
    """Each part of the weights, its bytes in the run's dtype and where it lives."""
    weights = report.weights
    assert weights is not None
    table = _table(f"Weights ({report.plan.dtype} run)", "part", "bytes",
                   "device")
    for name, num_bytes in weights.parts.items():
        device = weights.devices[name]
        table.add_row(name, _size(num_bytes),
                      "auto (the device's memory decides)" if device == "auto" else device)
    table.add_row(f"on {weights.run_device}", _size(weights.device_bytes), "")
    table.add_row("total", _size(weights.total_bytes), "")
    return table


def _fit_lines(report: SpecReport) -> tuple[str, str]:
    """`fits in 24GiB: yes` and what it needs: weights + KV plan + margin."""
    fit = report.fit
    assert fit is not None
    return (f"fits in {_size(fit.memory_bytes)}: {'yes' if fit.fits else 'no'}",
            f"  needs {_size(fit.needed_bytes)}: weights on {report.device} "
            f"{_size(fit.weight_bytes)} + KV plan {_size(fit.kv_bytes)} + "
            f"margin for activations {_size(fit.margin_bytes)} (an estimate)")


def _size(num_bytes: int) -> str:
    """format_bytes, with one decimal of GiB above 10GiB too: a fit can turn on 0.1GiB."""
    return format_bytes(num_bytes) if num_bytes < 2**30 else f"{num_bytes / 2**30:.1f}GiB"


def _policy(reset_at_boundary: bool) -> str:
    return "tumbling (reset at boundary)" if reset_at_boundary else "sliding"


def _memory_table(report: SpecReport) -> Table:
    plan = report.plan
    memory = _table(f"Memory plan ({plan.dtype} on {report.device}, {plan.page_tokens} tokens "
                    f"per page)")
    rows = [
        ("page size", format_bytes(plan.page_bytes)),
        ("pages per frame", str(plan.pages_per_frame)),
        ("history pages per session", str(plan.history_pages_per_session)),
        ("in-flight pages (shared)", str(plan.inflight_pages)),
        ("register pages (shared)", str(plan.register_pages)),
        ("cross-attention per session", format_bytes(plan.cross_attention_bytes_per_session)),
        ("model-owned state per session", format_bytes(plan.model_owned_bytes_per_session)),
        ("bytes per session", format_bytes(plan.bytes_per_session)),
        ("shared bytes", format_bytes(plan.fixed_bytes)),
        ("budget", format_bytes(plan.budget_bytes)),
        ("sessions that fit", str(plan.session_capacity)),
        ("pages allocated", str(plan.total_pages)),
        ("bytes allocated", format_bytes(plan.total_bytes)),
    ]
    if report.num_ranks > 1:  # runtime.parallel: the plan above is one rank's
        rows += [("ranks (workers x cfg)", f"{report.num_ranks} ({report.workers} x "
                                           f"{report.cfg})"),
                 ("bytes allocated, all ranks", format_bytes(report.num_ranks
                                                             * plan.total_bytes))]
    for name, value in rows:
        memory.add_row(name, value)
    return memory


def warmup_summary(runner, report) -> dict:
    """Plain data for `ardiff warmup` (also its `--json`)."""
    stats = runner.cache.stats()
    return {
        "status": "skipped" if report.skipped_reason else "ok",
        "skipped_reason": report.skipped_reason,
        "latencies_s": [round(x, 6) for x in report.latencies_s],
        "total_s": round(report.total_s, 6),
        "pages_in_use_before": report.pages_in_use_before,
        "pages_in_use_after": report.pages_in_use_after,
        "leaked_pages": report.leaked_pages,
        "pages_total": stats.pages_total,
        "kv_bytes_allocated": stats.kv_bytes_allocated,
        "session_capacity": runner.plan.session_capacity,
        "backend": stats.backend,
    }


def print_warmup(summary: dict) -> None:
    table = _table("Warmup", "request", "latency")
    for i, latency in enumerate(summary["latencies_s"]):
        table.add_row(str(i), f"{latency * 1000:.1f} ms")
    totals = _table("")
    totals.add_row("total", f"{summary['total_s']:.3f} s")
    totals.add_row("pages in use before / after", f"{_count(summary['pages_in_use_before'])} / "
                                                  f"{_count(summary['pages_in_use_after'])}")
    totals.add_row("pages allocated", _count(summary["pages_total"]))
    totals.add_row("KV bytes allocated", format_bytes(summary["kv_bytes_allocated"]))
    totals.add_row("sessions that fit", str(summary["session_capacity"]))
    if summary["latencies_s"]:
        console.print(table)
    console.print(totals)


def _seconds(value) -> str:
    return "-" if value is None else (f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s")


def print_rollout(data: dict, to_stderr: bool = False) -> None:
    """The summary table at the end of `ardiff rollout`."""
    out = Console(stderr=True) if to_stderr else console
    timing, kv, frames = data["timing"], data["kv"], data["frames"]
    table = _table(f"Rollout: {data['status']}")
    latency = timing["block_latency_s"]
    rows = [
        ("frames written", f"{frames['written']} / {frames['requested']}"),
        ("time to first frame", _seconds(timing["time_to_first_frame_s"])),
        ("block latency p50 / p95 / max",
         " / ".join(_seconds(latency[k]) for k in ("p50", "p95", "max"))),
        ("frames per second", "-" if timing["frames_per_s"] is None
         else f"{timing['frames_per_s']:.1f}"),
        ("real-time factor", "-" if timing["real_time_factor"] is None
         else f"{timing['real_time_factor']:.2f}x at {frames['output_fps']:g} fps"),
        ("warmup", _seconds(timing["warmup_s"])),
        ("KV pages total / peak", f"{kv['pages_total']} / {kv['pages_peak']}"
         if kv.get("pages_total") is not None else "- (dense)"),
        ("KV bytes allocated", format_bytes(kv["kv_bytes_allocated"])),
        ("peak RSS", format_bytes(data["memory"]["peak_rss_bytes"])),
        ("sessions created / closed / evicted / failed",
         " / ".join(str(data["sessions"][k]) for k in ("created", "closed", "evicted", "failed"))),
    ]
    if data["memory"]["peak_device_bytes"] is not None:
        rows.append(("peak device memory", format_bytes(data["memory"]["peak_device_bytes"])))
    for output in data["outputs"]:
        rows.append((f"output ({output['codec']})",
                     f"{output['path']}  {output['frames']} frames, "
                     f"{format_bytes(output['bytes'])}"))
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)


def _count(value: int | None) -> str:
    """A page count, or `-` where there is none (dense backend, skipped warmup)."""
    return "-" if value is None else str(value)
