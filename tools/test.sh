#!/usr/bin/env bash
# Set up, install Chromium (the report tests), start the local Slurm cluster the Slurm tests
# run against, and run every test (slow and Slurm-marked ones included).  Extra arguments go
# to pytest.
#
#   tools/test.sh                  everything, as CI runs it
#   tools/test.sh --quick [ARGS]   the quick tier (docs/dev/testing.md): ruff, mypy and the tests
#                                  marked neither slow, slurm nor ray; no set-up, no Chromium
#                                  install, no Slurm cluster start (it needs the .venv made by a
#                                  full run or tools/setup.sh).  ARGS go to pytest as well.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK_TIER="not slow and not slurm and not ray"
# pytest-xdist workers: most tests wait on processes, servers and clusters rather than compute,
# so more workers than the 2 cores of the CI machine overlap the waits (4: docs/dev/testing.md
# has the whole runs with 3, 4 and 5).  Tests that share
# something machine-wide (the Slurm cluster, Ray, the sandbox) and tests whose module fixture
# builds something run as groups, each on one worker (tests/conftest.py).
# ORCHESTRA_TEST_WORKERS=0 runs everything in this process.
PARALLEL=(-n "${ORCHESTRA_TEST_WORKERS:-4}")
# Bytecode caches on: these machines set PYTHONDONTWRITEBYTECODE=1, and then each of the thousands of
# Python processes a run starts compiled orchestra's modules again, and each xdist worker rewrote and
# compiled every test module again (pytest's assertion rewriting: ~11 s of CPU a worker from nothing,
# ~6 s with its cache).  __pycache__ is git-ignored.  docs/dev/testing.md has the numbers.
unset PYTHONDONTWRITEBYTECODE

# ruff, then mypy while a `pytest --collect-only` of the same tests makes pytest's cache of the
# rewritten test modules once, for the xdist workers to read (stopped with the script, whatever ends it)
lint_and_warm() {
  ruff check orchestra tests benchmarks tools
  python -m pytest --collect-only -q -p no:xdist -p no:cacheprovider "$@" >/dev/null 2>&1 &
  warm=$!
  trap 'kill "$warm" 2>/dev/null || true' EXIT
  mypy orchestra
  wait "$warm" || true  # a collection error shows again, with its message, in the run itself
  trap - EXIT  # its pid is free from here on: never signal it again
}

if [ "${1-}" = "--quick" ]; then
  shift
  if [ ! -x .venv/bin/python ]; then
    echo "tools/test.sh --quick: no .venv here; run tools/setup.sh (or tools/test.sh) once first" >&2
    exit 2
  fi
  command -v chromium >/dev/null 2>&1 || echo "tools/test.sh --quick: Chromium is missing, the report" \
    "tests will fail; a full tools/test.sh run as root installs it" >&2
  . .venv/bin/activate
  lint_and_warm "$@"
  exec python -m pytest -q --durations=30 --cpu-durations=30 "${PARALLEL[@]}" -m "$QUICK_TIER" "$@"
fi
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
lint_and_warm "$@"
# .test-units.json: the seconds each unit of work took in this run; copied over
# tests/unit_seconds.json it orders the units of later runs (docs/dev/testing.md)
python -m pytest -q --durations=30 --cpu-durations=30 --record-units=.test-units.json "${PARALLEL[@]}" "$@"
