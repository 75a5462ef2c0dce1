#!/usr/bin/env bash
# One H200 (any CUDA GPU), from a bare machine with this checkout, in under 8 minutes:
#   bash benchmarks/gpu.sh [OUT_DIR]          (default: $OUT, else ./gpu-bench-out)
# Makes a venv, installs torch (the default index's Linux wheel is the CUDA build) and
# ardiff, then runs benchmarks/gpu_batch.py: paged vs dense vs the batched paged path at the
# Wan2.1-1.3B shape (configs/bench-wide.yaml, random weights, no model download), bf16,
# batch 1/2/4/8, eager and compiled; CUDA-event latencies, peak device memory. Writes
# OUT_DIR/gpu_batch.json and OUT_DIR/gpu_batch.md (+ nvidia-smi.txt, pip-freeze.txt).
# Any failure exits non-zero; what is not installed (FlashInfer) is skipped with a line.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-${OUT:-gpu-bench-out}}")"
total_s=${GPU_BENCH_TOTAL_S:-470}   # the whole script's limit (under 8 minutes)
start=$SECONDS
mkdir -p "$out"
say() { echo "gpu.sh: $*" >&2; }

command -v nvidia-smi > /dev/null || { say "no nvidia-smi: this needs a CUDA GPU"; exit 1; }
nvidia-smi > "$out/nvidia-smi.txt"
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"

venv="${GPU_BENCH_VENV:-$root/.venv-gpu}"
if [ ! -x "$venv/bin/python" ]; then
  # A CUDA torch already on the machine is used as it is (no 2.5 GB download).
  python3 -m venv --system-site-packages "$venv"
fi
if "$venv/bin/python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
    2> /dev/null; then
  say "using the machine's torch"
else
  say "installing torch (the default index's CUDA wheel) into $venv"
  "$venv/bin/pip" install --quiet --upgrade pip || true
  "$venv/bin/pip" install --quiet torch
fi
say "installing ardiff"
if ! "$venv/bin/pip" install --quiet -e "$root"; then
  say "pip could not install ardiff (offline?): running it from the source tree"
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
fi
"$venv/bin/pip" freeze > "$out/pip-freeze.txt"
"$venv/bin/python" - <<'EOF'
import importlib.util, sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu.sh: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no GPU")
print(f"gpu.sh: torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name()}", file=sys.stderr)
if importlib.util.find_spec("flashinfer") is None:
    print("gpu.sh: FlashInfer not installed: skipped (ardiff uses it when it is)",
          file=sys.stderr)
EOF

left=$(( total_s - (SECONDS - start) ))
if [ "$left" -lt 120 ]; then
  say "only ${left}s left of ${total_s}s after installing: too little to measure"; exit 1
fi
# The measurements stop starting arms 60 s before the limit; `timeout` is the backstop.
say "measuring (${left}s left)"
timeout --kill-after=10 "$left" "$venv/bin/python" "$root/benchmarks/gpu_batch.py" \
  --device cuda --out "$out" --budget-s $(( left - 60 )) "${@:2}"
say "done in $(( SECONDS - start ))s: $out/gpu_batch.md"
# Matrix-Game 2.0's geometry at 352x640 instead (30 layers, 880 tokens a frame, window 6,
# 3 steps; synthetic weights): bash benchmarks/gpu.sh OUT --shape matrix-game (arguments
# after OUT go to gpu_batch.py).
