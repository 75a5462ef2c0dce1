"""`ardiff bench` numbers as rows (measure, median, p10-p90), printed as a Rich table at
most `MAX_WIDTH` columns wide or as Markdown to paste; `--batch` has its own table, a row per
batch size. Measurements only: the targets they are held to live in docs/performance.md."""

from __future__ import annotations

from ardiff.kv.backends import backend_names
from ardiff.sizes import format_bytes

RATIO_LABELS = {"paged/dense": "paged / dense", "ardiff/reference": "ardiff / reference loop",
                "eager/compiled": "eager / compiled"}
MAX_WIDTH = 100  # every table fits this many columns (a pipe gets this width, not 80)
HEADER = ("measure", "median", "p10-p90")
BATCH_HEADER = ("B", "forwards", "latency", "frames/s", "speedup wall",
                "speedup CPU", "|diff| vs B=1", "KV pages")


def seconds(value: float | None) -> str:
    return "-" if value is None else (f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s")


def _spread(spread: dict | None, fmt) -> tuple[str, str]:
    if spread is None:
        return "-", ""
    return fmt(spread["median"]), f"{fmt(spread['p10'])} - {fmt(spread['p90'])}"


def _ratio(x: float) -> str:
    return f"{x:.3f}"


def _percent(x: float) -> str:
    return f"{x * 100:.1f}%"


def machine_line(m: dict) -> str:
    """The CPU model, torch's CPU capability, threads, cores and load of a bench's machine."""
    load = " ".join(f"{x:g}" for x in m["load_before"])
    after = " ".join(f"{x:g}" for x in m["load_after"])
    threads = f"{m['torch_threads']} torch thread" + ("s" if m["torch_threads"] > 1 else "")
    return (f"{m.get('cpu_model', 'unknown CPU')} (torch CPU capability "
            f"{m.get('cpu_capability', 'unknown')}), {m['cpus']} CPUs, {threads}, load average "
            f"{load} (after: {after})")


def title(data: dict, config: str) -> str:
    return (f"ardiff bench {config}: {data['repeats']} repeats x {data['blocks']} blocks per arm, "
            f"alternating per block; {machine_line(data['machine'])}")


def rows(data: dict) -> list[tuple[str, str, str]]:
    """Every row of the bench table, in order."""
    out = []
    for name, arm in data["arms"].items():
        out.append((f"{name}: wall per block", *_spread(arm["wall_s"], seconds)))
        out.append((f"{name}: model-thread CPU per block", *_spread(arm["cpu_s"], seconds)))
    out += _ratio_rows(data)
    for name, diff in data["max_abs_frame_diff"].items():
        out.append((f"max |frame difference|, {RATIO_LABELS[name]}", str(diff), ""))
    out += _kv_rows(data) + _encode_rows(data) + _sweep_rows(data) + _startup_rows(data)
    return out


def _ratio_rows(data: dict) -> list[tuple]:
    out = []
    for name, label in RATIO_LABELS.items():
        ratio = data["ratios"][name]
        if ratio is None:
            arm = name.split("/")[1]
            out.append((label, f"- ({data['unavailable'].get(arm, 'not run')})", ""))
            continue
        out.append((f"{label} (wall)", *_spread(ratio["wall"], _ratio)))
        out.append((f"{label} (CPU)", *_spread(ratio["cpu"], _ratio)))
    if data["compile_s"] is not None:
        out.append(("compile time (compiled - eager warmup)", seconds(data["compile_s"]), ""))
    return out


def _kv_rows(data: dict) -> list[tuple]:
    out = []
    for name in backend_names():
        arm = data["arms"][name]
        if arm["kv_bytes_allocated"] is None:
            continue
        out.append((f"KV bytes, {name} (/ plan minimum)",
                    f"{format_bytes(arm['kv_bytes_allocated'])} "
                    f"({arm['kv_bytes_vs_plan_min']:.2f})", ""))
    return out


def _encode_rows(data: dict) -> list[tuple]:
    enc = data["encode"]
    if enc is None:
        return []
    share = enc["share"]
    return [("encode share (encoder CPU / model CPU)", *_spread(share, _percent)),
            ("encoder / model CPU per frame",
             f"{enc['encoder_cpu_ms_per_frame']:.2f} / {enc['model_cpu_ms_per_frame']:.2f} ms",
             ""),
            ("video bytes per frame", f"{enc['bytes_per_frame']:.0f} B", "")]


def _sweep_rows(data: dict) -> list[tuple]:
    out = [(f"{p['frames']} frames: pages in use / RSS",
            f"{p['pages_in_use_max']} / {format_bytes(p['rss_bytes'])}", "")
           for p in data["sweep"]]
    growth = data["rss_growth"]
    if growth is not None:
        out.append(("RSS growth first -> last", _percent(growth), ""))
    out.append(("peak RSS", format_bytes(data["peak_rss_bytes"]), ""))
    return out


def _startup_rows(data: dict) -> list[tuple]:
    startup = data.get("startup_s") or {}
    out = []
    for name, label in (("help", "`ardiff --help`"), ("inspect_spec", "`ardiff inspect-spec`")):
        times = startup.get(name)
        if times is None:
            continue
        out.append((f"{label} start-up (wall)", *_spread(times["wall"], seconds)))
        out.append((f"{label} start-up (CPU)", *_spread(times["cpu"], seconds)))
    return out


def batch_title(data: dict, config: str) -> str:
    notice = f"; {data['notice']}" if data["notice"] else ""
    return (f"ardiff bench {config} --batch: {data['repeats']} repeats x {data['blocks']} "
            f"blocks per batch size, alternating per block; medians (p10-p90 in --json and "
            f"--markdown), latency per session and block; {machine_line(data['machine'])}"
            f"{notice}")


def _times(spread: dict | None, fmt) -> str:
    median, between = _spread(spread, fmt)
    return median if spread is None else f"{median} ({between})"


def _rate(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _forwards(forwards: dict[str, int]) -> str:
    return ", ".join(f"{sessions} x {count}" if len(forwards) > 1 else sessions
                     for sessions, count in forwards.items()) or "-"


def batch_rows(data: dict, spreads: bool = True) -> list[tuple[str, ...]]:
    """A row per batch size: latency, frames/s, paired speedups, frames, pages; each time
    its median, and with `spreads` its p10-p90 too."""
    def cell(spread: dict | None, fmt) -> str:
        return _times(spread, fmt) if spreads else _spread(spread, fmt)[0]

    out: list[tuple[str, ...]] = []
    for size in data["sizes"]:
        b, speedup, diff = size["batch"], size["speedup"], size["max_abs_frame_diff"]
        out.append((str(b), _forwards(size["forwards"]), cell(size["block_wall_s"], seconds),
                    cell(size["frames_per_s"], _rate),
                    cell(speedup["wall"], lambda x: f"{x:.2f}x"),
                    cell(speedup["cpu"], lambda x: f"{x:.2f}x"),
                    "-" if diff is None else f"{diff} ({size['rows_checked']}/{b} rows)",
                    f"{size['pages_in_use_max']} / {size['pages_total']}"))
    return out


def print_bench(data: dict, config: str) -> None:
    from rich.console import Console
    from rich.table import Table

    batch = data.get("mode") == "batch"
    table = Table(title=batch_title(data, config) if batch else title(data, config),
                  title_justify="left")
    for column in BATCH_HEADER if batch else HEADER:
        table.add_column(column)
    for row in batch_rows(data, spreads=False) if batch else rows(data):
        table.add_row(*row)
    console = Console()
    console.width = MAX_WIDTH if not console.is_terminal else min(console.width, MAX_WIDTH)
    console.print(table)


def markdown(data: dict, config: str) -> str:
    """The table as GitHub Markdown, its title as the line above."""
    batch = data.get("mode") == "batch"
    header = BATCH_HEADER if batch else HEADER
    lines = [batch_title(data, config) if batch else title(data, config), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in (batch_rows(data) if batch else rows(data))]
    return "\n".join(lines)
