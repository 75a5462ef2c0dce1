"""`ardiff serve` under a bounded load on loopback: N clients at once, each a session of F
frames in fast mode, with batching on (one forward for all due sessions) and off
(`serve.batch=1`). A real server process per arm (`ardiff serve --port 0`), real clients
(httpx, websockets). Prints, per arm: every frame delivered in order (or not), the p50/p95
gap between a client's frames, aggregate frames/s (all frames / first create to last
frame), and the server's RSS before the load and after each of `--rounds` loads on the same
server (flat: no growth after the first). Asserts nothing.

    python benchmarks/serve_load.py [--config configs/tiny-dit.yaml] [--clients 8] [--frames 64]
                                    [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

from ardiff.serve.frames import parse_frame_message

ARDIFF = str(Path(sys.executable).parent / "ardiff")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load_round(port: int, clients: int, frames: int) -> dict:
    """One load: `clients` sessions at once, each streamed to its end."""
    url = f"http://127.0.0.1:{port}"
    results: dict[int, tuple[list[int], list[float]]] = {}

    def client(index: int) -> None:
        response = httpx.post(f"{url}/v1/sessions", timeout=60, json={
            "frames": frames, "mode": "fast", "paused": True, "seed": index})
        response.raise_for_status()
        session = response.json()
        indices, arrivals = [], []
        with connect(f"ws://127.0.0.1:{port}{session['stream']}", max_size=2**24) as ws:
            ws.send(json.dumps({"pause": False}))
            for message in ws:
                if isinstance(message, str):
                    break
                header, _ = parse_frame_message(message)
                indices.append(header["frame"])
                arrivals.append(time.perf_counter())
        results[index] = (indices, arrivals)
        httpx.delete(f"{url}{session['stream'].rsplit('/stream', 1)[0]}", timeout=60)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end = max(arrivals[-1] for _, arrivals in results.values())
    gaps = [b - a for _, arrivals in results.values() for a, b in zip(arrivals, arrivals[1:])]
    in_order = all(indices == list(range(frames)) for indices, _ in results.values())
    return {"in_order": in_order, "frames": sum(len(i) for i, _ in results.values()),
            "frames_per_s": sum(len(i) for i, _ in results.values()) / (end - start),
            "gap_p50_ms": 1e3 * statistics.median(gaps),
            "gap_p95_ms": 1e3 * statistics.quantiles(gaps, n=20)[-1]}


def run_arm(config: str, clients: int, frames: int, batch: int | None, rounds: int) -> dict:
    args = [ARDIFF, "serve", config, "--port", "0", "--set", f"serve.max_sessions={clients}",
            "--set", f"serve.queue_frames={frames}",  # every frame reaches its client
            "--set", f"pipeline.args.session_capacity={clients}"]  # tiny-dit's, bouncing's
    if batch is not None:
        args += ["--set", f"serve.batch={batch}"]
    server = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        port = int(re.search(r":(\d+) \(", line).group(1))
        rss_before = rss_kib(server.pid)
        rounds_out = []
        for _ in range(rounds):
            rounds_out.append(load_round(port, clients, frames))
            rounds_out[-1]["rss_mib"] = rss_kib(server.pid) / 1024  # after the round's closes
        return {"in_order": all(r["in_order"] for r in rounds_out),
                "frames": sum(r["frames"] for r in rounds_out),
                "frames_per_s": statistics.median(r["frames_per_s"] for r in rounds_out),
                "gap_p50_ms": statistics.median(r["gap_p50_ms"] for r in rounds_out),
                "gap_p95_ms": statistics.median(r["gap_p95_ms"] for r in rounds_out),
                "rss_before_mib": rss_before / 1024,
                "rss_after_mib": [r["rss_mib"] for r in rounds_out]}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny-dit.yaml")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.clients} clients x {args.frames} frames, {args.config}")
    for name, batch in (("batched", None), ("one per forward", 1)):
        r = run_arm(args.config, args.clients, args.frames, batch, args.rounds)
        print(f"{name:>16}: in order {r['in_order']}, {r['frames']} frames, "
              f"{r['frames_per_s']:.1f} frames/s, gap p50 {r['gap_p50_ms']:.1f} ms p95 "
              f"{r['gap_p95_ms']:.1f} ms, server RSS {r['rss_before_mib']:.0f} MiB, after each "
              f"round {', '.join(f'{m:.0f}' for m in r['rss_after_mib'])} MiB")


if __name__ == "__main__":
    main()
