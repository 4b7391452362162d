"""The test suite's own setting: every process a test starts computes with one OpenMP thread.

Several pytest-xdist workers share a 2-core machine; a torch that takes every core in each of
them spin-waits for cores the others hold (tests/conftest.py sets ``OMP_NUM_THREADS=1``;
docs/dev/testing.md has the CPU it saves).  Before, ``lm_eval`` and any other torch a test started
took as many threads as the machine has cores.
"""

from __future__ import annotations

import subprocess
import sys


def test_a_torch_a_test_starts_takes_one_thread() -> None:
    code = "import torch; print(torch.get_num_threads(), torch.__config__.parallel_info().count('OMP_NUM_THREADS : 1'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["1", "1"], out.stdout + out.stderr
