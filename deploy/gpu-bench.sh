#!/usr/bin/env bash
# GPU benchmark for one H200-class GPU, embedded engine, full-size random CosyVoice2
# (writes it to ~/.cache/voiceagent once, ~3 GB). Needs only torch (CUDA build) and
# voiceagent. Prints one JSON line per scenario; finishes in a few minutes.
#   bash deploy/gpu-bench.sh [path/to/python]
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-.venv/bin/python}"
va=("$py" -m voiceagent.cli --log-level warning)
timeout 240 "${va[@]}" bench --scenario chunk-cost --device cuda --json
timeout 300 "${va[@]}" bench --model "$HOME/.cache/voiceagent/cosyvoice2-full-random" \
  --device cuda --sessions 1,8 --turns 2 --max-speech-s 6 --lead-ms 100000 --json
