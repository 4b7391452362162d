#!/usr/bin/env bash
# Set up, start the local Slurm cluster the Slurm tests run against, and run every test
# (slow and Slurm-marked ones included).  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/slurm_cluster.sh start
. .venv/bin/activate
ruff check orchestra tests benchmarks tools
mypy orchestra
python -m pytest -q "$@"
