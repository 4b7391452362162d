"""``orchestra CONFIG`` / ``python run.py CONFIG``: plan, run and summarise an evaluation.

``orchestra compare RUN_A RUN_B ...`` (also ``python run.py compare ...``) compares run folders
(:mod:`orchestra.cli.compare`).

A thin wrapper on :mod:`orchestra.api`: flags become config edits, then ``api.plan`` or
``api.run`` does the work.  Exit codes: 0 every task done; 1 some task failed, was skipped or
cancelled (the summary names each with its log), or a write failed; 2 bad config or usage;
130 interrupted (Ctrl-C or SIGTERM); 129 SIGHUP.

While tasks run, a signal stops them and the run still ends with its summary (``api.run``).
Anywhere else (a config loading, the summary and report being built, ``--mode viz``) the CLI's
own handlers end the process at once with one line and the same exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from orchestra.api import EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from orchestra.errors import ConfigError, UserError
from orchestra.terminal import printable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 2, as for config errors
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orchestra", description="Evaluate language models from one config file.",
                epilog="orchestra compare RUN_A RUN_B ...: compare run folders sample by sample "
                       "(orchestra compare -h)")
    p.add_argument("config", help="config file (.py or .yaml)")
    p.add_argument("-w", "--work-dir", help="folder for run folders (overrides the config's work_dir)")
    p.add_argument("-r", "--reuse", nargs="?", const="latest", metavar="TIMESTAMP|latest",
                   help="continue a run folder: finished outputs are reused, the rest runs")
    p.add_argument("--mode", choices=["all", "infer", "eval", "viz"], default="all",
                   help="run both stages (all), one stage, or only rebuild the summary and report (viz)")
    p.add_argument("--debug", action="store_true", help="run tasks in this process, one by one, with tracebacks")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan of both stages (a summary when a stage has many tasks); makes no run "
                   "folder (what it learns of the data is cached, as a run's planning caches it)")
    p.add_argument("--list", action="store_true", help="with --dry-run: list every task and sweep variant")
    p.add_argument("--max-num-workers", type=int, help="tasks running at once, for every stage")
    p.add_argument("--retry", type=int, help="extra attempts for a failed task, for every stage")
    p.add_argument("--slurm", action="store_true", help="run every stage with SlurmRunner")
    p.add_argument("-p", "--partition", help="Slurm partition (with --slurm)")
    p.add_argument("-q", "--qos", help="Slurm QOS (with --slurm)")
    p.add_argument("--dlc", action="store_true", help="run every stage with DLCRunner (Alibaba Cloud PAI-DLC)")
    p.add_argument("--aliyun-cfg", metavar="PATH",
                   help="aliyun config file for --dlc (default ~/.aliyun.cfg; see docs/dlc.md)")
    p.add_argument("--yes", action="store_true",
                   help="run (or with --dry-run, plan) a sweep of more variants than its max_variants")
    p.add_argument("--trace", metavar="PATH",
                   help="also write the run's timeline as a Chrome/Perfetto trace to PATH "
                        "(always written to <run>/summary/trace.json)")
    p.add_argument("--cfg-options", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config values, e.g. infer.runner.max_num_workers=4")
    return p


def _apply_cli_overrides(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """CLI flags win over the config file (defaults flow one way)."""
    from orchestra.config import DEFAULT_STAGES

    if args.work_dir:
        raw["work_dir"] = args.work_dir
    if args.slurm and not args.partition:
        raise UserError("--slurm needs -p/--partition")
    if (args.partition or args.qos) and not args.slurm:
        raise UserError("-p/--partition and -q/--qos need --slurm")
    aliyun = _aliyun_cfg(args)
    for stage in ("infer", "eval"):
        # what a runner switched by --slurm/--dlc keeps: the loop's options, and every runner key
        # given with --cfg-options (``infer.runner.time_limit=60``: meant for the new runner)
        keep_keys = {"task", "max_num_workers", "retry", "timeout_s", *_runner_keys_given(args.cfg_options, stage)}
        keep_keys.discard("type")
        st = raw.get(stage)
        if st is None:
            st = raw[stage] = {k: dict(v) for k, v in DEFAULT_STAGES[stage].items()}
        if not isinstance(st, dict):
            continue  # validation will name it
        runner = st.get("runner")
        if runner is None:
            runner = st["runner"] = dict(DEFAULT_STAGES[stage]["runner"])
        if not isinstance(runner, dict):
            continue
        if args.slurm:
            if not _is_slurm_runner(runner.get("type")):  # a SlurmRunner keeps its own options
                keep = {k: runner[k] for k in keep_keys if k in runner}
                runner.clear()
                runner.update(keep, type="orchestra.runners.slurm.SlurmRunner")
            runner["partition"] = args.partition
            if args.qos:
                runner["qos"] = args.qos
        if aliyun is not None:
            if not _is_runner(runner.get("type"), "DLCRunner"):  # a DLCRunner keeps its own options
                keep = {k: runner[k] for k in keep_keys if k in runner}
                runner.clear()
                runner.update(keep, type="orchestra.runners.dlc.DLCRunner")
            runner["aliyun_cfg"] = dict(aliyun)
        if args.max_num_workers is not None:
            runner["max_num_workers"] = args.max_num_workers
        if args.retry is not None:
            runner["retry"] = args.retry


def _runner_keys_given(cfg_options: list[str], stage: str) -> set[str]:
    """The keys of ``stage``'s runner that ``--cfg-options`` items name (``infer.runner.qos=x``: qos)."""
    keys = set()
    for item in cfg_options:
        parts = item.partition("=")[0].split(".")
        if len(parts) >= 3 and parts[0] == stage and parts[1] == "runner":
            keys.add(parts[2])
    return keys


def _is_slurm_runner(runner_type: Any) -> bool:
    """Whether a runner ``type`` (a class, a registry name or a dotted path) is SlurmRunner."""
    return _is_runner(runner_type, "SlurmRunner")


def _is_runner(runner_type: Any, cls_name: str) -> bool:
    """Whether a runner ``type`` (a class, a registry name or a dotted path) names ``cls_name``."""
    name = runner_type.__name__ if isinstance(runner_type, type) else str(runner_type)
    return name.replace(":", ".").rsplit(".", 1)[-1] == cls_name


def _aliyun_cfg(args: argparse.Namespace) -> dict[str, Any] | None:
    """The aliyun config of ``--dlc`` (None without it), read from ``--aliyun-cfg`` or ``~/.aliyun.cfg``."""
    if args.aliyun_cfg and not args.dlc:
        raise UserError("--aliyun-cfg needs --dlc")
    if not args.dlc:
        return None
    if args.slurm:
        raise UserError("--dlc and --slurm exclude each other: one runner per run")
    from orchestra.runners.dlc.config import load_aliyun_file

    path = args.aliyun_cfg or "~/.aliyun.cfg"
    if not os.path.isfile(os.path.expanduser(path)):
        raise UserError(f"--dlc needs an aliyun config file: {path} not found (give --aliyun-cfg PATH; "
                        "see docs/dlc.md)")
    try:
        return load_aliyun_file(path)
    except ValueError as exc:
        raise ConfigError(f"--aliyun-cfg {exc}") from None


class _Signalled(BaseException):
    """A SIGINT, SIGTERM or SIGHUP outside the window where ``api.run`` stops tasks for it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_signalled(signum: int, frame: FrameType | None) -> None:
    raise _Signalled(signum)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str] | None = None) -> int:
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _raise_signalled) for sig in _SIGNALS}
    try:
        return _guarded(argv)
    except (_Signalled, KeyboardInterrupt) as exc:
        for sig in previous:  # the process is on its way out: a second signal must not interrupt that
            signal.signal(sig, signal.SIG_IGN)
        signum = exc.signum if isinstance(exc, _Signalled) else signal.SIGINT
        print(f"\norchestra: {signal.Signals(signum).name} received, stopped (files already written stay; "
              "-r continues the run)", file=sys.stderr)
        return EXIT_HANGUP if signum == signal.SIGHUP else EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _guarded(argv: list[str] | None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] == "compare":  # `orchestra compare RUN_A RUN_B ...`: its own command
        from orchestra.cli.compare import main as compare_main

        return compare_main(given[1:])
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except UserError as exc:
        if args.debug:
            raise
        print(printable(f"orchestra: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a full disk, a read-only folder, a permission: one line, no traceback
        if args.debug:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(printable(f"orchestra: error:{where}: {exc.strerror or exc} (check that the folder exists, is "
                        "writable and its disk has room; --debug shows the traceback)"), file=sys.stderr)
        return EXIT_FAILED


def _main(args: argparse.Namespace) -> int:
    from orchestra import api

    for flag, value in (("--max-num-workers", args.max_num_workers), ("--retry", args.retry)):
        if value is not None and value < (1 if flag == "--max-num-workers" else 0):
            raise UserError(f"{flag} {value}: must be >= {1 if flag == '--max-num-workers' else 0}")

    def edit(raw: dict[str, Any]) -> None:
        _apply_cli_overrides(raw, args)

    if args.list and not args.dry_run:
        raise UserError("--list needs --dry-run (it lists the tasks a run would start)")
    if args.dry_run:
        # yes=args.yes: a sweep too large to run is too large to plan (100 x 100 x 100 variants
        # would take minutes and gigabytes to list); its one line names its size instead
        view = api.plan(args.config, reuse=args.reuse, mode=args.mode, cfg_options=args.cfg_options, yes=args.yes,
                        _edit_raw=edit)
        chunk: list[str] = []
        for line in view.lines(full=args.list):  # 200,000 tasks: printed in chunks, never one string
            chunk.append(line)
            if len(chunk) >= 2000:
                api.say("\n".join(chunk))
                chunk.clear()
        api.say("\n".join(chunk))
        return EXIT_OK
    run = api.run(args.config, mode=args.mode, reuse=args.reuse, debug=args.debug, yes=args.yes,
                  cfg_options=args.cfg_options, trace=args.trace, _edit_raw=edit)
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
