#!/usr/bin/env bash
# A smoke test for your pipeline in CI: its spec plans, it warms up without leaking KV
# pages, and a short rollout writes a playable video with the frames asked for.
#
#   bash examples/ci_smoke.sh [CONFIG]      # default: configs/tiny-dit.yaml of this repo
#
# Run it with the environment that has ardiff installed (its `ardiff` and `python` first
# on PATH; set PYTHON to use another interpreter). It writes stats.json and smoke.mp4 in
# the current folder (keep them as CI artifacts) and exits non-zero, with a line saying
# why, when anything is off. SMOKE_FRAMES and SMOKE_FPS change the rollout's length.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
config="${1:-$here/../configs/tiny-dit.yaml}"
frames="${SMOKE_FRAMES:-12}"
fps="${SMOKE_FPS:-16}"
python="${PYTHON:-python}"

fail() { echo "ci_smoke: FAIL: $*" >&2; exit 1; }

command -v ardiff >/dev/null \
    || fail "no ardiff command on PATH; activate the environment that has ardiff"
"$python" -c "import ardiff, av" 2>/dev/null \
    || fail "$python cannot import ardiff and av; set PYTHON to the interpreter that has ardiff"

echo "ci_smoke: inspect-spec $config"
ardiff inspect-spec "$config" || fail "ardiff inspect-spec exited $?"
echo "ci_smoke: warmup"
ardiff warmup "$config" || fail "ardiff warmup exited $?"
echo "ci_smoke: rollout of $frames frames"
ardiff rollout "$config" --frames "$frames" --fps "$fps" --json stats.json -o smoke.mp4 \
    --no-progress || fail "ardiff rollout exited $? (see stats.json)"

"$python" - "$frames" "$fps" <<'EOF'
import json
import sys
from fractions import Fraction

import av

frames, fps = int(sys.argv[1]), Fraction(sys.argv[2])


def fail(message):
    sys.exit(f"ci_smoke: FAIL: {message}")


stats = json.load(open("stats.json"))
if stats["status"] != "ok":
    fail(f"stats.json: status is {stats['status']!r}: {stats['error']}")
if stats["frames"]["written"] != frames:
    fail(f"stats.json: {stats['frames']['written']} frames written, {frames} requested")
rtf = stats["timing"].get("real_time_factor")
if not isinstance(rtf, (int, float)) or rtf <= 0:
    fail(f"stats.json: timing.real_time_factor is {rtf!r}, expected a number > 0")
with av.open("smoke.mp4") as container:
    stream = container.streams.video[0]
    decoded = sum(1 for _ in container.decode(stream))
    rate = stream.average_rate
if decoded != frames:
    fail(f"smoke.mp4: {decoded} frames decode, {frames} requested")
if rate != fps:
    fail(f"smoke.mp4: plays at {rate} fps, {fps} requested")
print(f"ci_smoke: ok: {decoded} frames at {rate} fps, real-time factor {rtf:.2f}")
EOF
