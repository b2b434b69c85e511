#!/usr/bin/env bash
# Set up voiceagent on a fresh Debian/Ubuntu machine: system libraries, a virtual
# environment in .venv, the CPU build of torch, and the package.
#   bash deploy/setup.sh          # to run the server
#   bash deploy/setup.sh --test   # also the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

sudo=""
[[ "$(id -u)" != 0 ]] && sudo="sudo"
# libopus0: opuslib's codec. Tests also speak real speech prompts with espeak-ng, drive
# the demo page (web/) in Debian's chromium, and place phone calls with real 8 kHz human
# speech: Asterisk's prompts (asterisk-core-sounds-en-wav) and their transcripts
# (asterisk-core-sounds-en, core-sounds-en.txt.gz). prometheus: a real Prometheus scrapes
# a test server and runs the PromQL of docs/operations.md (tests/test_prometheus.py).
# wordnet-base: WordNet's example sentences, a source of the training corpus
# (docs/training.md; tests/test_train_data.py).
packages=(libopus0)
# Debian's and Ubuntu's python3 makes no venv without python3-venv (ensurepip)
python3 -c "import ensurepip" 2>/dev/null || packages+=(python3-venv)
[[ -n "$extras" ]] && packages+=(espeak-ng chromium asterisk-core-sounds-en-wav asterisk-core-sounds-en prometheus wordnet-base)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  # One apt at a time: setup-piper.sh may run beside this (as in .ci/run); the flock
  # queues our own scripts, the timeout waits for anyone else's apt.
  $sudo flock /var/lock/voiceagent-apt.lock sh -c \
    'apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@"' \
    apt "${missing[@]}"
fi

python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# torch first and pinned: 2.13.0 is the CPU wheel; an unpinned torch would pull CUDA builds.
# Where pip's own index serves the CUDA build of that version (plain PyPI on Linux x86_64),
# name the CPU one: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash deploy/setup.sh
.venv/bin/pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
.venv/bin/pip install -q -e ".${extras}"
.venv/bin/python -c "import torch, opuslib, webrtcvad, soxr; print('voiceagent ready, torch', torch.__version__)"
