"""``orchestra CONFIG`` / ``python run.py CONFIG``: plan, run and summarise an evaluation.

Exit codes: 0 every task done; 1 some task failed, was skipped or cancelled (the summary
names each with its log); 2 bad config or usage; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType
from typing import Any

from orchestra.errors import ConfigError, RunFolderBusyError, UserError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 2, as for config errors
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orchestra", description="Evaluate language models from one config file.")
    p.add_argument("config", help="config file (.py or .yaml)")
    p.add_argument("-w", "--work-dir", help="folder for run folders (overrides the config's work_dir)")
    p.add_argument("-r", "--reuse", nargs="?", const="latest", metavar="TIMESTAMP|latest",
                   help="continue a run folder: finished outputs are reused, the rest runs")
    p.add_argument("--mode", choices=["all", "infer", "eval", "viz"], default="all",
                   help="run both stages (all), one stage, or only rebuild the summary (viz)")
    p.add_argument("--debug", action="store_true", help="run tasks in this process, one by one, with tracebacks")
    p.add_argument("--dry-run", action="store_true", help="print the plan of both stages; write nothing")
    p.add_argument("--max-num-workers", type=int, help="tasks running at once, for every stage")
    p.add_argument("--retry", type=int, help="extra attempts for a failed task, for every stage")
    p.add_argument("--slurm", action="store_true", help="run every stage with SlurmRunner")
    p.add_argument("-p", "--partition", help="Slurm partition (with --slurm)")
    p.add_argument("-q", "--qos", help="Slurm QOS (with --slurm)")
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
    for stage in ("infer", "eval"):
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
                keep = {k: runner[k] for k in ("task", "max_num_workers", "retry", "timeout_s") if k in runner}
                runner.clear()
                runner.update(keep, type="orchestra.runners.slurm.SlurmRunner")
            runner["partition"] = args.partition
            if args.qos:
                runner["qos"] = args.qos
        if args.max_num_workers is not None:
            runner["max_num_workers"] = args.max_num_workers
        if args.retry is not None:
            runner["retry"] = args.retry


def _is_slurm_runner(runner_type: Any) -> bool:
    """Whether a runner ``type`` (a class, a registry name or a dotted path) is SlurmRunner."""
    name = runner_type.__name__ if isinstance(runner_type, type) else str(runner_type)
    return name.replace(":", ".").rsplit(".", 1)[-1] == "SlurmRunner"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except UserError as exc:
        if args.debug:
            raise
        print(f"orchestra: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a full disk, a read-only folder, a permission: one line, no traceback
        if args.debug:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"orchestra: error:{where}: {exc.strerror or exc} (check that the folder exists, is writable "
              "and its disk has room; --debug shows the traceback)", file=sys.stderr)
        return EXIT_FAILED


def _print(*values: Any, file: Any = None) -> None:
    """``print`` that survives a reader who left (``orchestra ... | head``): the run goes on
    and its exit code still says how it went."""
    stream = file or sys.stdout
    try:
        print(*values, file=stream, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _main(args: argparse.Namespace) -> int:
    from orchestra.config import load_config, validate

    for flag, value in (("--max-num-workers", args.max_num_workers), ("--retry", args.retry)):
        if value is not None and value < (1 if flag == "--max-num-workers" else 0):
            raise UserError(f"{flag} {value}: must be >= {1 if flag == '--max-num-workers' else 0}")
    raw = load_config(args.config, args.cfg_options)
    _apply_cli_overrides(raw, args)
    raw_prices = raw.pop("prices", None)  # the report's price table (orchestra/summary/costs.py)
    cfg = validate(raw, args.config)
    from orchestra.summary.costs import check_prices

    prices = check_prices(raw_prices, [m["abbr"] for m in cfg.models], args.config)

    from orchestra.datasets.info import dataset_infos
    from orchestra.paths import RunPaths, choose_run_folder
    from orchestra.plan import make_plan

    infos = dataset_infos(cfg.datasets, args.config, write_cache=not args.dry_run)
    runners = _build_runners(cfg, args)
    # Only now, with nothing left to reject, is a run folder chosen (and a new one created).
    reuse = args.reuse
    if reuse is None and args.mode in ("eval", "viz"):
        reuse = "latest"  # scoring or summarising a new, empty folder would do nothing
    root, existed = choose_run_folder(cfg.work_dir, reuse, allow_new=args.mode != "viz", create=not args.dry_run)
    paths = RunPaths(root)
    if args.dry_run:
        return _print_plan(make_plan(cfg, infos, paths), runners, paths, existed)

    if args.mode == "viz":
        return _viz(paths, args, prices)

    from filelock import FileLock, Timeout

    os.makedirs(root, exist_ok=True)
    lock = FileLock(paths.lock)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise RunFolderBusyError(f"{root} is in use by another orchestrator (lock {paths.lock})") from None
    try:
        return _run(cfg, args, paths, infos, runners, prices)
    finally:
        lock.release()


def _viz(paths: Any, args: argparse.Namespace, prices: dict[str, Any]) -> int:
    """Rebuild the summary of a run folder from the config that run saved (not the config
    file as it is now); nothing else in the folder changes."""
    from orchestra.config import load_config, validate
    from orchestra.datasets.info import dataset_infos
    from orchestra.plan import make_plan
    from orchestra.summary.table import build_summary, render_text, write_summary

    if not os.path.isfile(paths.config):
        raise UserError(f"--mode viz: {paths.root} holds no config.py (not a run folder of orchestra)")
    cfg = validate(load_config(paths.config), paths.config)
    infos = dataset_infos(cfg.datasets, paths.config, write_cache=False)
    plan = make_plan(cfg, infos, paths)
    summary = build_summary(paths, [m["abbr"] for m in cfg.models], plan.all_units["eval"])
    write_summary(summary, paths)
    _print(render_text(summary))
    _print(f"run folder: {paths.root}", file=sys.stderr)
    _write_report(paths, cfg, summary, plan, args, prices)
    return EXIT_FAILED if summary.missing else EXIT_OK


def _write_report(paths: Any, cfg: Any, summary: Any, plan: Any, args: argparse.Namespace,
                  prices: dict[str, Any]) -> None:
    """Write the HTML report and the trace, and name them on the last line; a report that
    cannot be written is a warning (the run's results and exit code stand)."""
    from orchestra.summary.costs import load_prices, save_prices
    from orchestra.summary.progress import api_model_abbrs
    from orchestra.summary.report import write_report

    try:
        if prices:
            save_prices(paths, prices)  # --mode viz later finds them even if the config drops them
        else:
            prices = load_prices(paths)
        files = write_report(paths, summary, plan.all_units["eval"], api_model_abbrs(cfg.models), prices, args.trace)
    except Exception as exc:  # a bug here must not hide the run's own outcome
        if args.debug:
            raise
        _print(f"orchestra: warning: could not write the report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    trace = f" (trace: {args.trace})" if args.trace else ""
    _print(f"report: {files.report}{trace}", file=sys.stderr)


def _build_runners(cfg: Any, args: argparse.Namespace) -> dict[str, Any]:
    runners = {}
    for name, stage in cfg.stages.items():
        try:
            runners[name] = stage.runner_cls(**stage.runner_kwargs)  # built (checked) even for --debug
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{args.config}: {name}.runner: {exc}") from None
    if args.debug:  # every stage in this process, one task at a time, tracebacks shown
        from orchestra.runners.inprocess import InProcessRunner

        runners = {name: InProcessRunner() for name in runners}
    return runners


def _print_plan(plan: Any, runners: dict[str, Any], paths: Any, existed: bool) -> int:
    _print(f"run folder: {paths.root}{' (reused)' if existed else ' (new; nothing is written by --dry-run)'}")
    for stage in ("infer", "eval"):
        tasks = plan.tasks[stage]
        reused = len(plan.reused[stage])
        runner = runners[stage]
        _print(f"\n[{stage}] {len(tasks)} task(s) to run, {reused} output(s) reused, "
              f"runner {type(runner).__name__} (max_num_workers={runner.max_num_workers}, retry={runner.retry})")
        for task in tasks:
            resources = {"gpu_ids": ["<gpu>"] * task.num_gpus}
            cmd = runners[stage].get_command(task, paths.task_spec(task.task_id), resources, 1,
                                             paths.task_log(stage, task.task_id))
            units = ", ".join(f"{u.name}[{u.start}:{u.end}]" for u in task.units)
            _print(f"  {task.task_id}  cost={task.cost:g}  gpus={task.num_gpus}  units: {units}")
            _print(f"    $ {cmd.display()}")
    return EXIT_OK


def _run(cfg: Any, args: argparse.Namespace, paths: Any, infos: Any, runners: dict[str, Any],
         prices: dict[str, Any]) -> int:
    from orchestra.config import dump_config
    from orchestra.events import EventLog
    from orchestra.plan import make_plan
    from orchestra.runners.base import RunContext, TaskResult, TaskState
    from orchestra.summary.logs import with_excerpt
    from orchestra.summary.progress import StageProgress, api_model_abbrs
    from orchestra.summary.table import build_summary, render_text, write_summary

    paths.make_dirs()
    dump_config(cfg.resolved, paths.config)
    events = EventLog(paths.events)
    ctx = RunContext(paths, events)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not ctx.stop.is_set():
            received.append(signum)
            _print(f"\norchestra: {signal.Signals(signum).name} received, stopping every task...", file=sys.stderr)
        ctx.stop.set()

    for sig in previous:
        signal.signal(sig, on_signal)
    plan = make_plan(cfg, infos, paths)
    events.emit("run_started", mode=args.mode, pid=os.getpid(),
                tasks={s: [t.task_id for t in ts] for s, ts in plan.tasks.items()})
    results: list[TaskResult] = []
    try:
        stages = {"all": ["infer", "eval"], "infer": ["infer"], "eval": ["eval"]}[args.mode]
        for stage in stages:
            if ctx.stop.is_set():
                break
            tasks = plan.tasks[stage]
            if not tasks:
                continue
            _print(f"[{stage}] {len(tasks)} task(s), {len(plan.reused[stage])} output(s) reused", file=sys.stderr)
            progress = None if args.debug else StageProgress(
                stage, tasks, paths.events, api_model_abbrs(cfg.models), len(getattr(runners[stage], "gpus", ())))
            ctx.on_change = progress
            try:
                results += runners[stage].launch(tasks, ctx)
            finally:
                if progress is not None:
                    progress.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    interrupted = ctx.stop.is_set()
    events.emit("run_finished", interrupted=interrupted,
                failed=[r.task_id for r in results if r.state is not TaskState.DONE])
    summary = build_summary(paths, [m["abbr"] for m in cfg.models], plan.all_units["eval"])
    write_summary(summary, paths)
    _print(render_text(summary))
    bad = [r for r in results if r.state is not TaskState.DONE]
    for r in bad:
        log = f"; log: {r.log_path}" if os.path.exists(r.log_path) else ""
        reason = with_excerpt(r.reason, r.log_path) if r.state is TaskState.FAILED else r.reason
        _print(f"{r.state.value.upper()}: {r.stage} task {r.task_id} ({reason}){log}", file=sys.stderr)
    _print(f"run folder: {paths.root}", file=sys.stderr)
    _write_report(paths, cfg, summary, plan, args, prices)
    if interrupted:
        # 128 + the signal, as shells report it (Ctrl-C 130, SIGHUP 129, SIGTERM 130 as before)
        return 129 if received and received[0] == signal.SIGHUP else EXIT_INTERRUPTED
    return EXIT_FAILED if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
