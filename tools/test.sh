#!/usr/bin/env bash
# Set up, install Chromium (the report tests), start the local Slurm cluster the Slurm tests
# run against, and run every test (slow and Slurm-marked ones included).  Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# The report tests open report.html in headless Chromium, from Debian's packages.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
  else
    echo "tools/test.sh: Chromium is missing and only root can install it:" \
         "apt-get install -y --no-install-recommends chromium fonts-liberation" >&2
  fi
fi
bash tools/slurm_cluster.sh start
. .venv/bin/activate
ruff check orchestra tests benchmarks tools
mypy orchestra
python -m pytest -q --durations=30 "$@"
