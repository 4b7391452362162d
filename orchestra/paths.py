"""Every path inside a run folder comes from ``RunPaths``; nothing is relative to the cwd."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import time
from dataclasses import dataclass

from orchestra.errors import UserError
from orchestra.privdir import UnsafeFolderError, folder_problem

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
RUN_MARKER = ".orchestra-run"
_RUN_NAME = re.compile(r"\d{8}_\d{6}(_\d+)?")
MAX_NAME = 96  #: the longest :func:`safe_name`: a task id (two of them) and its temporary files fit in 255 bytes
_FOLDER_MODE = 0o755  #: a new work dir and run folder: never writable by group or others (the umask may take more)


def safe_name(name: str) -> str:
    """A file-name-safe form of a model or dataset abbreviation, distinct for distinct names.

    A name of letters, digits and ``._+-`` of at most :data:`MAX_NAME` characters is kept as it
    is; any other name is cleaned, cut to fit and gets a short hash of the original (``数学`` ->
    ``_-1c3e...``, ``a/b`` and ``a b`` differ).  The bound keeps every file a task writes, and
    its task id, within a file system's 255 bytes (a sweep's variant of a 300-character prompt
    names its files by its abbr).
    """
    cleaned = _UNSAFE.sub("_", name).strip("._")
    if cleaned == name and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{(cleaned or '_')[:MAX_NAME - 9] if len(name) > MAX_NAME else cleaned or '_'}-{digest}"


def shard_file_stem(name: str) -> tuple[str, int] | None:
    """``('arith', 1)`` if a file-safe dataset name looks like dataset ``arith``'s shard 1."""
    m = re.fullmatch(r"(.+)_(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else None


@dataclass(frozen=True)
class RunPaths:
    """The layout of one run folder ``<work_dir>/<timestamp>/``."""

    root: str

    @property
    def config(self) -> str:
        return os.path.join(self.root, "config.py")

    @property
    def events(self) -> str:
        return os.path.join(self.root, "events.jsonl")

    @property
    def marker(self) -> str:
        """An empty file that says: this folder is a run folder of orchestra."""
        return os.path.join(self.root, RUN_MARKER)

    @property
    def lock(self) -> str:
        return os.path.join(self.root, ".orchestra.lock")

    @property
    def summary_dir(self) -> str:
        return os.path.join(self.root, "summary")

    @property
    def summary_lock(self) -> str:
        """Held (shared) by whoever writes ``summary/`` (a run's end, ``--mode viz``, which takes
        no run lock): -r clears the temporary files there only when nobody holds it."""
        return os.path.join(self.summary_dir, ".writers.lock")

    @property
    def slurm_dir(self) -> str:
        """Batch job scripts and Slurm's own job output (``SlurmRunner(launcher='sbatch')``)."""
        return os.path.join(self.root, "slurm")

    @property
    def dlc_dir(self) -> str:
        """``DLCRunner``'s records: the ledger of every DLC job it submitted (``jobs.jsonl``) and the
        exit codes its jobs write from the cloud (``exit/<job name>``)."""
        return os.path.join(self.root, "dlc")

    @property
    def ray_dir(self) -> str:
        """``RayRunner``'s ledger of every actor it started (``jobs.jsonl``): ``-r`` kills those an
        orchestrator killed outright left behind."""
        return os.path.join(self.root, "ray")

    @property
    def servers(self) -> str:
        """Managed servers: ``ledger.jsonl``, and per model ``replicas.json`` and the replicas' logs."""
        return os.path.join(self.root, "servers")

    @property
    def shared(self) -> str:
        """What a dataset builds once for all its shards in this run (lm-eval's requests:
        ``datasets/lmeval_shared.py``), read by every infer task of the dataset."""
        return os.path.join(self.root, "shared")

    def batch_ledger(self, model_abbr: str) -> str:
        """Batch mode's record of every provider batch of one model (id, the requests it holds)."""
        return os.path.join(self.root, "batches", f"{safe_name(model_abbr)}.jsonl")

    def task_spec(self, task_id: str) -> str:
        return os.path.join(self.root, "tasks", f"{task_id}.py")

    @property
    def worker_logs(self) -> str:
        """Folder of warm workers' own output (their tasks' output goes to the task logs)."""
        return os.path.join(self.root, "logs", "workers")

    @property
    def gpu_samples(self) -> str:
        """GPU utilisation sampled while local launches hand out GPUs (``runners/local/gpumon.py``)."""
        return os.path.join(self.root, "gpu.jsonl")

    @property
    def gpu_sampler_log(self) -> str:
        """What the GPU sampler's ``nvidia-smi`` said on stderr."""
        return os.path.join(self.root, "logs", "gpu-sampler.log")

    def task_log(self, stage: str, task_id: str) -> str:
        return os.path.join(self.root, "logs", stage, f"{task_id}.log")

    def predictions(self, model_abbr: str, dataset_abbr: str, shard: int | None) -> str:
        suffix = "" if shard is None else f"_{shard}"
        return os.path.join(
            self.root, "predictions", safe_name(model_abbr), f"{safe_name(dataset_abbr)}{suffix}.jsonl"
        )

    def checkpoint(self, prediction_path: str) -> str:
        """The append-only sample checkpoint that becomes ``prediction_path`` when complete."""
        return prediction_path + ".ckpt"

    def results(self, model_abbr: str, dataset_abbr: str) -> str:
        return os.path.join(self.root, "results", safe_name(model_abbr), f"{safe_name(dataset_abbr)}.json")

    def details(self, model_abbr: str, dataset_abbr: str) -> str:
        return os.path.join(
            self.root, "results", safe_name(model_abbr), f"{safe_name(dataset_abbr)}.details.jsonl"
        )

    def make_dirs(self) -> None:
        for sub in ("tasks", "logs", "predictions", "results", "summary"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)


def is_run_folder(root: str, work_dir: str) -> bool:
    """Whether ``root`` is a run folder orchestra made: it holds the marker, or (folders made
    before the marker existed) it is a timestamp-named folder of ``work_dir`` with a config."""
    if os.path.isfile(os.path.join(root, RUN_MARKER)):
        return True
    named = os.path.dirname(os.path.abspath(root)) == os.path.abspath(work_dir) and _RUN_NAME.fullmatch(
        os.path.basename(root)) is not None
    return named and os.path.isfile(os.path.join(root, "config.py"))


def _swappable(path: str) -> str | None:
    """Why another user could put a folder of theirs at ``path`` after it was checked, or None:
    a symbolic link on the way that another user (not root) owns, and may point elsewhere at any
    time; or a folder above it that others may write without the sticky bit (as /tmp has), in
    which anyone may rename ``path``'s folder away and put their own in its place."""
    at = os.sep
    for part in os.path.abspath(path).split(os.sep)[1:]:
        at = os.path.join(at, part)
        try:
            st = os.lstat(at)
        except OSError:
            break
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            return f"goes through {at}, a symbolic link owned by uid {st.st_uid}"
    real = os.path.realpath(path)
    above = os.path.dirname(real)
    while True:
        try:
            mode = os.stat(above).st_mode
        except FileNotFoundError:  # made later, 0755 (_make_folders)
            mode = 0
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return f"is inside {above}, which others can write (mode {stat.S_IMODE(mode):o}, not sticky)"
        if above == os.path.dirname(above):
            return None
        above = os.path.dirname(above)


def _refuse_unsafe(path: str, what: str) -> None:
    """Raise :class:`~orchestra.privdir.UnsafeFolderError` if ``path`` exists and another user
    could write it (``what``: ``'run folder'``, judged itself, or ``'work dir'``, judged where a
    symbolic link leads, and refused too if another user could swap it, :func:`_swappable`)."""
    follow = what == "work dir"
    problem = _swappable(path) if follow else None
    if problem is None and not (os.path.exists(path) if follow else os.path.lexists(path)):
        return
    problem = problem or folder_problem(path, follow_links=follow)
    if problem is None:
        return
    if problem.startswith("is writable"):
        fix = f"chmod go-w {path}"
    elif "link" in problem:
        fix = "give the real path"
    else:
        fix = "use a work dir of your own (-w)"
    raise UnsafeFolderError(f"{what} {path} {problem}: another user could forge the files orchestra reads "
                            f"back from it; {fix}")


def _make_folders(path: str) -> None:
    """``os.makedirs`` with every folder it makes ``_FOLDER_MODE`` (masked by the umask), the
    missing ones above ``path`` too (``os.makedirs`` makes those 0777 less the umask)."""
    if os.path.isdir(path):
        return
    _make_folders(os.path.dirname(path))
    try:
        os.mkdir(path, _FOLDER_MODE)
    except FileExistsError:
        pass


def check_run_folder(root: str) -> None:
    """Refuse (:class:`~orchestra.privdir.UnsafeFolderError`, one line, exit 2 at the CLI) a run
    folder whose files another user could forge: ``root`` must be a real folder (not a symbolic
    link), owned by this user and not writable by group or others, and so must the folder that
    holds it (the work dir; a symbolic link to a folder of ours is fine there)."""
    _refuse_unsafe(os.path.dirname(os.path.abspath(root)), "work dir")
    _refuse_unsafe(root, "run folder")


def choose_run_folder(work_dir: str, reuse: str | None, allow_new: bool = True,
                      create: bool = True) -> tuple[str, bool]:
    """The run folder to use and whether it already existed; refused by :func:`check_run_folder`
    if another user could write it or its work dir.

    ``reuse=None`` claims a new timestamped folder (created, with its marker, unless
    ``create`` is false as for ``--dry-run``; the work dir and the run folder are made without
    write permission for group and others, whatever the umask); ``'latest'`` takes the newest
    run folder of ``work_dir``; anything else names one, by timestamp or path, and must be a run folder.
    """
    root, existed = _choose(work_dir, reuse, allow_new, create)
    check_run_folder(root)
    return root, existed


def _run_order(name: str) -> tuple[str, int]:
    """A run folder name's place in time: its second, then the number of runs before it in that
    second (``_10`` after ``_9``, where the names alone sort it first)."""
    return name[:15], int(name[16:] or 0)


def _choose(work_dir: str, reuse: str | None, allow_new: bool, create: bool) -> tuple[str, bool]:
    work_dir = os.path.abspath(work_dir)
    named = os.path.join(work_dir, reuse) if reuse else work_dir
    try:  # every file of a run (events, task specs, the config) holds its paths as UTF-8 text
        named.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(named).decode("utf-8", "backslashreplace")
        raise UserError(f"{'run folder' if reuse else 'work dir'} {shown}: the name is not valid UTF-8 (orchestra "
                        "writes run-folder paths into its files as UTF-8); give a folder whose name is") from None
    if os.path.exists(work_dir) and not os.path.isdir(work_dir):
        raise UserError(f"work dir {work_dir} is a file, not a folder; give -w a folder")
    if reuse is None:
        stamp = time.strftime("%Y%m%d_%H%M%S")
        root = os.path.join(work_dir, stamp)
        n = 1
        while True:
            try:
                if create:
                    _refuse_unsafe(work_dir, "work dir")  # before anything is made in a folder of another user
                    _make_folders(work_dir)
                    os.mkdir(root, _FOLDER_MODE)  # claims the name: two runs started in one second never share it
                    with open(os.path.join(root, RUN_MARKER), "w", encoding="utf-8"):
                        pass
                elif os.path.exists(root):
                    raise FileExistsError(root)
                return root, False
            except FileExistsError:
                root = os.path.join(work_dir, f"{stamp}_{n}")
                n += 1
    if reuse == "latest":
        runs = sorted((d for d in os.listdir(work_dir) if _RUN_NAME.fullmatch(d)
                       and os.path.isdir(os.path.join(work_dir, d))), key=_run_order) if os.path.isdir(work_dir) else []
        if not runs and not allow_new:
            raise UserError(f"no run folder in {work_dir} to reuse")
        if not runs:
            print(f"orchestra: no earlier run in {work_dir}; starting a new one", file=sys.stderr)
            return _choose(work_dir, None, True, create)
        return os.path.join(work_dir, runs[-1]), True
    root = os.path.abspath(os.path.join(work_dir, reuse))
    if not os.path.isdir(root):
        raise UserError(f"-r {reuse}: no run folder {root}")
    if not is_run_folder(root, work_dir):
        raise UserError(f"-r {reuse}: {root} is not a run folder of orchestra (no {RUN_MARKER} marker); "
                        f"give the timestamp of a run in {work_dir} or the path of a run folder")
    return root, True
