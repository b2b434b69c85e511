#!/usr/bin/env bash
# The first-packet and concurrency benches in one command, each within a time budget,
# on full-size random CosyVoice2 weights (written to ~/.cache/voiceagent once, ~3 GB),
# then the training tests on the device (the LM, flow and vocoder trained there end
# where the CPU's do). Prints one JSON line per step, the benches' the same objects
# `voiceagent bench --json` prints:
#   {"bench": "first-packet", "device": ..., "report": {...}}
#   {"bench": "ws", "device": ..., "report": {...}}
#   {"bench": "train-device", "device": ..., "report": {"pytest_exit": 0}}  (log on stderr)
# Made for a CUDA machine; runs on the CPU too (slowly), which proves the plumbing.
#   bash deploy/gpu-bench.sh
# Environment (all optional): PY (python with voiceagent; .venv/bin/python), DEVICE
# (auto: cuda if torch sees one), MODEL (a model directory instead of the random one),
# SESSIONS (1,8,32), TURNS (5), STEP_S (seconds each bench may take; 300).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PY:-.venv/bin/python}"
device="${DEVICE:-auto}"
full="$HOME/.cache/voiceagent/cosyvoice2-full-random"
model="${MODEL:-$full}"
step_s="${STEP_S:-300}"
va=("$py" -m voiceagent.cli --log-level warning)

line() {  # bench name, then its JSON report on stdin
  "$py" -c 'import json, sys; print(json.dumps({"bench": sys.argv[1], "device": sys.argv[2], "report": json.load(sys.stdin)}))' "$1" "$device"
}

# first packet: baseline vs optimized, slices (writes the random full-size model if needed)
model_flag=()
if [[ -n "${MODEL:-}" ]]; then model_flag=(--model "$model"); fi
timeout "$step_s" "${va[@]}" bench --scenario first-packet "${model_flag[@]}" \
  --device "$device" --turns "${TURNS:-5}" --json | line first-packet

# concurrency: sessions at once over WebSocket, time to first audio and real-time factor
timeout "$step_s" "${va[@]}" bench --scenario ws --model "$model" --device "$device" \
  --sessions "${SESSIONS:-1,8,32}" --turns 2 --max-speech-s 6 --lead-ms 100000 --json \
  | line ws

# training on the device: each part's steps there equal the CPU's (pytest's log on stderr)
set +e
VOICEAGENT_TRAIN_DEVICE="$device" timeout "$step_s" "$py" -m pytest -q -p no:cacheprovider \
  tests/test_train_update.py tests/test_train_lm.py tests/test_train_flow.py \
  tests/test_train_vocoder.py -k device >&2
echo "{\"pytest_exit\": $?}" | line train-device
