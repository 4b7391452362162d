"""lm-eval's stock task index, built once per test session and copied into the fresh
``ORCHESTRA_CACHE_DIR`` of each test that runs an lm-eval task but does not test the index.

Every ``run.py`` that touches an lm-eval task needs lm-eval's index of its ~15,000 stock tasks
(``orchestra/datasets/lmeval_index.py``): built, it costs ~15 s of CPU, and a test that starts
from an empty cache builds it again (a ``--dry-run`` builds it each time: it writes no cache).
The index's file name is a key of the installed lm-eval (its version, its task folder and that
folder's stamps), so a copy made in this session is the one a run in this session reads.

The build runs once for all pytest-xdist workers of a session (under a file lock in the session's
shared temporary folder); each test gets its own copy, never a folder shared with another test.
``tests/test_lmeval_seed.py`` checks that a seeded cache is read, not built again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: builds the stock index into ``$ORCHESTRA_CACHE_DIR/lmeval_index/<key>.json``, as a run does
_BUILD = "from orchestra.datasets.lmeval_index import task_manager; task_manager([])"


class LmEvalIndex:
    """The session's stock index (built on first use) and copies of it."""

    def __init__(self, root: Path) -> None:
        self._root = root  # shared by the session's workers
        self._seeded: dict[Path, tuple[str, int, int]] = {}  # cache -> its copy's name, inode, mtime

    def built(self) -> Path:
        """The index file, built now unless another worker of this session built it."""
        cache = self._root / "lmeval_index_cache"
        with open(self._root / "lmeval_index.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = sorted((cache / "lmeval_index").glob("*.json"))
            if not found:
                env = {**os.environ, "ORCHESTRA_CACHE_DIR": str(cache), "HF_DATASETS_OFFLINE": "1",
                       "HF_HUB_OFFLINE": "1"}
                done = subprocess.run([sys.executable, "-c", _BUILD], cwd=REPO, env=env, capture_output=True,
                                      text=True, timeout=600)
                assert done.returncode == 0, done.stderr[-3000:]
                found = sorted((cache / "lmeval_index").glob("*.json"))
            (index,) = found
            return index

    def seed(self, cache: Path) -> Path:
        """``cache`` (an ``ORCHESTRA_CACHE_DIR`` that does not exist yet) made, holding a copy of
        the stock index; returned."""
        index = self.built()
        folder = cache / "lmeval_index"
        folder.mkdir(mode=0o700, parents=True)
        os.chmod(cache, 0o700)  # a cache folder others can write is refused
        shutil.copyfile(index, folder / index.name)
        st = (folder / index.name).stat()
        self._seeded[cache] = (index.name, st.st_ino, st.st_mtime_ns)
        return cache

    def untouched(self, cache: Path) -> bool:
        """Whether ``cache``'s index is still the seeded copy alone: a run that built the index
        again would have replaced it (a new file, atomically) or written one under another key."""
        files = [(p.name, p.stat().st_ino, p.stat().st_mtime_ns) for p in (cache / "lmeval_index").iterdir()]
        return files == [self._seeded[cache]]
