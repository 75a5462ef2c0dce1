"""Paged vs dense vs the batched paged path at the Wan2.1-1.3B shape, on one GPU (issue #26).

    python benchmarks/gpu_batch.py --out DIR                        # CUDA, bf16 (gpu.sh runs it)
    python benchmarks/gpu_batch.py --device cpu --tiny --out DIR    # the same code, tiny, ~1 s

A random-weight transformer stack (no model download) of configs/bench-wide.yaml's geometry
(1560 tokens per frame, 12 heads of 128, 3 frames per block, a 21-frame window, its layer
count unless --layers; width 1536 and FFN 8960 as Wan2.1-1.3B) makes AR blocks (num_steps
probes + the commit) of B sessions over ardiff's KV cache, three ways:

    dense    the B sessions one after another, dense backend (one forward per session)
    paged    the B sessions one after another, paged backend
    batched  one forward of all B rows (KVStateBatch) on the paged backend

each eager and compiled (torch.compile of the layer stack; ardiff.kv.ops registered), for
B in --batch. Per arm: block latency from CUDA events (median, p10-p90), frames/s, peak
device memory (max_memory_allocated, reset per arm), the largest |difference| of its first
timed block's output against eager dense, compile seconds. Eager arms run first; arms that
would pass --budget-s are skipped and say so. Writes DIR/gpu_batch.json and gpu_batch.md;
any error is a traceback and a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch import nn

import ardiff
from ardiff.dtypes import DTYPE_BYTES
from ardiff.kv.backend import create_cache
from ardiff.kv.batch import KVStateBatch
from ardiff.kv.plan import make_plan
from ardiff.kv.state import open_state
from ardiff.pipelines.shared.rows import OneRow, as_rows

ROOT = Path(__file__).resolve().parent.parent
WIDE = ROOT / "configs" / "bench-wide.yaml"
WAN_DIM, WAN_FFN = 1536, 8960  # Wan2.1-1.3B: 12 heads x 128, FFN width
# Matrix-Game 2.0 at 352x640 (docs/matrix-game.md): Wan2.1-1.3B's 30 layers of 12 x 128 over
# 880 tokens a frame, 3-frame blocks, a window of 6 (universal), 3 steps; its action modules
# and image cross-attention are not in the stack (the KV cache's share is what is measured).
MATRIX_GAME = {"num_layers": 30, "num_kv_heads": 12, "head_size": 128, "tokens_per_frame": 880,
               "frames_per_block": 3, "window_frames": 6, "num_steps": 3}
TINY = {"num_layers": 2, "num_kv_heads": 2, "head_size": 16, "tokens_per_frame": 8,
        "frames_per_block": 2, "window_frames": 6, "num_steps": 1}
BRANCH = "main"
PATHS = ("dense", "paged", "batched")
FILL_Q_TOKENS = 1
BUDGET_BYTES = 1 << 44  # the plan then holds exactly the B sessions asked for
EAGER_ARM_S, COMPILED_ARM_S = 0.0, 60.0  # time an arm needs left to start (a compile)


@dataclasses.dataclass(frozen=True)
class Geometry:
    spec: ardiff.ARDiffusionKVCacheSpec
    num_steps: int
    dim: int
    ffn: int

    @property
    def block_tokens(self) -> int:
        return self.spec.frames_per_block * self.spec.tokens_per_frame


def geometry(tiny: bool, layers: int | None, most_sessions: int,
             shape: str = "wide") -> Geometry:
    """bench-wide.yaml's (or the tiny, or Matrix-Game's) geometry, holding `most_sessions`
    sessions."""
    args = dict(TINY) if tiny else dict(MATRIX_GAME) if shape == "matrix-game" \
        else dict(yaml.safe_load(WIDE.read_text())["pipeline"]["args"])
    num_steps = int(args.pop("num_steps", 1))
    if layers is not None:
        args["num_layers"] = layers
    spec = ardiff.ARDiffusionKVCacheSpec(
        **args, session_capacity=most_sessions,
        kv_branches=(ardiff.ARDiffusionKVBranchSpec(BRANCH, 0),))
    dim = spec.num_kv_heads * spec.head_size
    if tiny or dim != WAN_DIM:
        return Geometry(spec, num_steps, dim, 4 * dim)
    return Geometry(spec, num_steps, WAN_DIM, WAN_FFN)


class Layer(nn.Module):
    """Pre-norm self-attention through the KV block + a GELU FFN, Wan-sized."""

    def __init__(self, dim: int, ffn: int, heads: int, head_size: int) -> None:
        super().__init__()
        self.heads, self.head_size = heads, head_size
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"),
                                 nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor, blk: Any, index: int) -> torch.Tensor:
        rows, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(rows, tokens, 3, self.heads,
                                               self.head_size).unbind(2)
        x = x + self.out(blk.attend(index, q, k, v).reshape(rows, tokens, dim))
        return x + self.ffn(self.norm2(x))


class Stack(nn.Module):
    def __init__(self, g: Geometry) -> None:
        super().__init__()
        s = g.spec
        self.layers = nn.ModuleList(Layer(g.dim, g.ffn, s.num_kv_heads, s.head_size)
                                    for _ in range(s.num_layers))

    def forward(self, x: torch.Tensor, blk: Any) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x, blk, index)
        return x


class Timer:
    """Block latencies: CUDA events read once the arm is done, or perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, start: Any) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((start, end))
        else:
            self.marks.append(time.perf_counter() - start)

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in self.marks]
        return list(self.marks)


class Sessions:
    """B sessions on one cache, their windows filled with seeded K/V (no model: cheap)."""

    def __init__(self, cache: Any, g: Geometry, rows: int, tag: str, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.cache, self.g, self.device, self.dtype = cache, g, device, dtype
        self.ids = [f"{tag}-{row}" for row in range(rows)]
        s = g.spec
        fill = -(-(s.sink_frames + s.window_frames) // s.frames_per_block) + 1
        for row, sid in enumerate(self.ids):
            for block in range(fill):
                generator = torch.Generator(device).manual_seed(1000 * row + block)
                state = open_state(cache, sid)
                with state.block(BRANCH, commit=True) as blk:
                    for layer in range(s.num_layers):
                        k, v = (torch.randn(g.block_tokens, s.num_kv_heads, s.head_size,
                                            generator=generator, device=device, dtype=dtype)
                                for _ in range(2))
                        blk.attend(layer, k[:FILL_Q_TOKENS], k, v)
                state.close()
        self.block = 0

    def inputs(self) -> torch.Tensor:
        """Block `self.block`'s hidden states of every row: [B, tokens, dim], seeded."""
        out = []
        for row in range(len(self.ids)):
            generator = torch.Generator(self.device).manual_seed(7919 * row + self.block)
            out.append(torch.randn(self.g.block_tokens, self.g.dim, generator=generator,
                                   device=self.device, dtype=self.dtype))
        return torch.stack(out)


def run_block(path: str, stack: Callable[..., torch.Tensor], sessions: Sessions,
              num_steps: int) -> torch.Tensor:
    """num_steps probes and the commit of every session: one forward of all rows
    (batched), or one per session (dense, paged). Returns the commit's outputs."""
    x = sessions.inputs()
    out = x
    for step in range(num_steps + 1):
        commit = step == num_steps
        if path == "batched":
            states = KVStateBatch([open_state(sessions.cache, sid) for sid in sessions.ids])
            try:
                with as_rows(states).block(BRANCH, commit=commit) as blk:
                    out = stack(x, blk)
            finally:
                for state in states:
                    state.close()
            continue
        outs = []
        for row, sid in enumerate(sessions.ids):
            state = open_state(sessions.cache, sid)
            try:
                with OneRow(state).block(BRANCH, commit=commit) as blk:
                    outs.append(stack(x[row:row + 1], blk))
            finally:
                state.close()
        out = torch.cat(outs)
    sessions.block += 1
    return out


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {"median": statistics.median(values), "p10": at(0.1), "p90": at(0.9),
            "n": len(values)}


@dataclasses.dataclass
class Options:
    device: torch.device
    dtype: torch.dtype
    sizes: list[int]
    repeats: int
    warmup: int
    arm_s: float
    budget_s: float
    compile: bool
    compile_backend: str


def measure_arm(g: Geometry, stack: nn.Module, path: str, mode: str, size: int,
                opts: Options, reference: dict[tuple[int, int], torch.Tensor],
                compiled: dict[str, Any]) -> dict[str, Any]:
    """One (path, mode, B): a fresh cache and sessions, warmup blocks, timed blocks."""
    backend = "dense" if path == "dense" else "paged"
    rows = size if path == "batched" else 1
    dtype_name = str(opts.dtype).removeprefix("torch.")
    plan = make_plan(g.spec, dtype_name, DTYPE_BYTES[dtype_name], BUDGET_BYTES,
                     max_sessions=size, batch_rows=rows,  # a compiled paged attend's op:
                     stores_registers=mode == "compiled" and backend == "paged")
    cache = create_cache(plan, backend, opts.device)
    sessions = Sessions(cache, g, size, f"{path}-{mode}-b{size}", opts.device, opts.dtype)
    fn: Callable[..., torch.Tensor] = stack
    if mode == "compiled":
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(stack, backend=opts.compile_backend)
        fn = compiled["fn"]
    start = time.perf_counter()
    run_block(path, fn, sessions, g.num_steps)  # compiles (again, for a new shape)
    _sync(opts.device)
    first_s = time.perf_counter() - start
    for _ in range(opts.warmup):
        run_block(path, fn, sessions, g.num_steps)
    if opts.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    timer = Timer(opts.device)
    first = None
    started = time.perf_counter()
    while len(timer.marks) < opts.repeats:
        mark = timer.start()
        out = run_block(path, fn, sessions, g.num_steps)
        timer.stop(mark)
        if first is None:
            first = out.float().cpu()
        if len(timer.marks) >= 3 and time.perf_counter() - started > opts.arm_s:
            break
    seconds = timer.seconds()
    peak = torch.cuda.max_memory_allocated() if opts.device.type == "cuda" else None
    assert first is not None
    block_index = sessions.block - len(seconds)  # every arm's first timed block: the same
    key = (size, block_index)
    if path == "dense" and mode == "eager":
        reference[key] = first
    diff = float((first - reference[key]).abs().max()) if key in reference else None
    frames = size * g.spec.frames_per_block
    block = spread(seconds)
    del sessions, cache
    if opts.device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch": size, "path": path, "mode": mode, "block_s": block,
            "frames_per_s": frames / block["median"],
            "per_frame_s": block["median"] / frames,
            "peak_bytes": peak, "kv_bytes": plan.total_bytes, "first_block_s": first_s,
            "max_abs_diff_vs_dense_eager": diff, "skipped": None}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def machine(opts: Options, g: Geometry) -> dict[str, Any]:
    probe = create_cache(make_plan(g.spec, str(opts.dtype).removeprefix("torch."),
                                   DTYPE_BYTES[str(opts.dtype).removeprefix("torch.")],
                                   BUDGET_BYTES, max_sessions=1, stores_registers=False),
                         "paged", opts.device)
    flashinfer = importlib.util.find_spec("flashinfer") is not None
    info = {"device": str(opts.device), "torch": torch.__version__,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "dtype": str(opts.dtype).removeprefix("torch."),
            "kernel": probe.kernel_name, "stacked_kernel": probe.stacked_fn is not None,
            "flashinfer": flashinfer, "cuda": torch.version.cuda,
            "load_average": [round(x, 2) for x in os.getloadavg()]}
    if opts.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(opts.device)
    return info


def run(opts: Options, g: Geometry, say: Callable[[str], None]) -> dict[str, Any]:
    began = time.perf_counter()
    torch.manual_seed(0)
    stack = Stack(g).to(opts.device, opts.dtype).eval()
    info = machine(opts, g)
    if not info["flashinfer"]:
        say("FlashInfer: not installed, skipped (pip install flashinfer-python to measure it)")
    reference: dict[tuple[int, int], torch.Tensor] = {}
    compiled: dict[str, Any] = {}
    arms: list[dict[str, Any]] = []
    modes = ["eager", "compiled"] if opts.compile else ["eager"]
    if opts.compile:
        import ardiff.kv.ops  # noqa: F401  registers ardiff::paged_attend before tracing

        _raise_recompile_limit()
    with torch.inference_mode():
        for mode in modes:
            for size in opts.sizes:
                for path in PATHS:
                    left = opts.budget_s - (time.perf_counter() - began)
                    if left < (COMPILED_ARM_S if mode == "compiled" else EAGER_ARM_S):
                        say(f"{mode} {path} B={size}: skipped, it would pass --budget-s "
                            f"{opts.budget_s:g}")
                        arms.append({"batch": size, "path": path, "mode": mode,
                                     "skipped": f"would pass --budget-s {opts.budget_s:g}"})
                        continue
                    arm = measure_arm(g, stack, path, mode, size, opts, reference, compiled)
                    say(f"{mode:8s} {path:7s} B={size}: {1000 * arm['block_s']['median']:.2f} ms "
                        f"per block, {arm['frames_per_s']:.1f} frames/s")
                    arms.append(arm)
    s = g.spec
    return {"machine": info, "elapsed_s": time.perf_counter() - began,
            "geometry": {"layers": s.num_layers, "heads": s.num_kv_heads,
                         "head_size": s.head_size, "tokens_per_frame": s.tokens_per_frame,
                         "frames_per_block": s.frames_per_block,
                         "window_frames": s.window_frames, "sink_frames": s.sink_frames,
                         "num_steps": g.num_steps, "dim": g.dim, "ffn": g.ffn},
            "arms": arms}


def _raise_recompile_limit() -> None:
    """Every (path, B) is a shape of its own: let dynamo keep them all compiled."""
    config = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(64, getattr(config, name)))


def markdown(data: dict[str, Any]) -> str:
    m, geo = data["machine"], data["geometry"]
    lines = [f"{m.get('gpu', m['device'])}, torch {m['torch']} (CUDA {m['cuda']}), "
             f"{m['dtype']}, kernel {m['kernel']} (stacked form: "
             f"{'yes' if m['stacked_kernel'] else 'no'}), FlashInfer "
             f"{'installed' if m['flashinfer'] else 'not installed'}; {geo['layers']} layers, "
             f"{geo['tokens_per_frame']} tokens/frame, {geo['heads']}x{geo['head_size']} heads, "
             f"{geo['frames_per_block']} frames/block, window {geo['window_frames']}, "
             f"{geo['num_steps']} probe(s) + commit per block", "",
             "| B | path | mode | block latency, ms (p10-p90) | frames/s | vs dense eager B=1, "
             "per frame | peak memory | max abs diff vs dense eager | first block "
             "(compiles) |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = next((a for a in data["arms"] if a.get("path") == "dense"
                 and a.get("mode") == "eager" and a.get("batch") == 1 and not a["skipped"]),
                None)
    for a in data["arms"]:
        if a["skipped"]:
            lines.append(f"| {a['batch']} | {a['path']} | {a['mode']} | skipped: "
                         f"{a['skipped']} | | | | | |")
            continue
        b = a["block_s"]
        ratio = "" if base is None else f"{base['per_frame_s'] / a['per_frame_s']:.2f}x"
        peak = "-" if a["peak_bytes"] is None else f"{a['peak_bytes'] / 2**30:.2f} GiB"
        diff = "-" if a["max_abs_diff_vs_dense_eager"] is None else \
            f"{a['max_abs_diff_vs_dense_eager']:.3g}"
        compile_s = f"{a['first_block_s']:.1f} s"
        lines.append(f"| {a['batch']} | {a['path']} | {a['mode']} | {1000 * b['median']:.2f} "
                     f"({1000 * b['p10']:.2f}-{1000 * b['p90']:.2f}) | "
                     f"{a['frames_per_s']:.1f} | {ratio} | {peak} | {diff} | {compile_s} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> tuple[Options, Geometry, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-bench-out")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny geometry (tests, CPU)")
    parser.add_argument("--shape", choices=("wide", "matrix-game"), default="wide",
                        help="bench-wide.yaml's geometry, or Matrix-Game 2.0's at 352x640")
    parser.add_argument("--batch", default="1,2,4,8")
    parser.add_argument("--layers", type=int, default=None,
                        help="layers of the stack (default: bench-wide.yaml's)")
    parser.add_argument("--repeats", type=int, default=20, help="most timed blocks per arm")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--arm-s", type=float, default=4.0,
                        help="stop timing an arm after this long (at least 3 blocks)")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="arms that would start past this are skipped, and say so")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--compile-backend", default="inductor")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_batch.py: --device cuda, but torch sees no CUDA device "
                         f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); "
                         f"install a CUDA wheel of torch, or use --device cpu --tiny")
    sizes = [int(b) for b in args.batch.split(",")]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    opts = Options(device, dtype, sizes, args.repeats, args.warmup, args.arm_s, args.budget_s,
                   not args.no_compile, args.compile_backend)
    return opts, geometry(args.tiny, args.layers, max(sizes), args.shape), Path(args.out)


def main(argv: list[str] | None = None) -> int:
    opts, g, out = parse(argv)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)) if opts.device.type == "cuda"
                          else 1)
    data = run(opts, g, lambda line: print(f"gpu_batch: {line}", flush=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_batch.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "gpu_batch.md").write_text(markdown(data))
    print(markdown(data), end="")
    print(f"gpu_batch: wrote {out / 'gpu_batch.json'} and {out / 'gpu_batch.md'} "
          f"({data['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
