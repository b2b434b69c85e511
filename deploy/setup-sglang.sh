#!/usr/bin/env bash
# SGLang in its own virtual environment (.venv-sglang): it brings its own torch, which
# must never enter the main environment. About 10 GB and a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv-sglang/bin/python ]] || ! .venv-sglang/bin/python -c "import sglang" 2>/dev/null; then
  python3 -m venv .venv-sglang
  .venv-sglang/bin/pip install -q --upgrade pip
  .venv-sglang/bin/pip install -q "sglang==0.5.23"
fi
# sglang-router: the load balancer in front of several SGLang servers (tests route through it)
.venv-sglang/bin/python -c "import sglang_router" 2>/dev/null \
  || .venv-sglang/bin/pip install -q "sglang-router==0.3.2"
.venv-sglang/bin/python -c "import sglang, sglang_router; print('sglang', sglang.__version__, 'ready')"
