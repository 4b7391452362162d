"""Where does a forwarded secret end up?  One real run with a unique canary value, then a search.

Runs ``python run.py`` on a small config (a deterministic model on one dataset, an OpenAI-compatible
model against a local stub server with ``key_env``) with the runner named on the command line and
``forward_env=['ORC_CANARY_TOKEN']``, the canary in that variable and (with ``-api``) in the
API key variable, which only the model names (``key_env``).
While it runs, ``ps -eo args`` is sampled; afterwards the canary is searched for in:

* the run folder (every file) and what the CLI printed (also with ``--debug``);
* every file under /tmp changed during the run, with whether users other than its owner may read it;
* Slurm: the controller's StateSaveLocation (root / SlurmUser only), ``scontrol show job -d`` and
  ``scontrol write batch_script`` of the run's jobs (what any user, or the job's owner, can ask);
* Ray: the session folders under /tmp/ray (with the ray runner).

Usage (the local Slurm cluster up, SLURM_CONF exported)::

    python benchmarks/secret_canary.py sbatch srun local

It prints one table row per place: how many hits, and whether a hit is readable by other users.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORWARD = "forward_env=['ORC_CANARY_TOKEN']"  # the API key: key_env only; LocalRunner forwards nothing
RUNNERS = {
    "local": "type=LocalRunner, max_num_workers=2",
    "srun": f"type=SlurmRunner, launcher='srun', partition='debug', poll_interval_s=0.2, {FORWARD}",
    "sbatch": f"type=SlurmRunner, launcher='sbatch', partition='debug', poll_interval_s=0.3, {FORWARD}",
    "ray": f"type=RayRunner, max_num_workers=2, {FORWARD}",
}


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint.  ``mode``: ``plain`` answers '7'; ``echo`` is a hostile
    operator that puts the request's Authorization header in a 500 body, then in the answer;
    ``redirect`` sends every request on to ``_Stub.other`` (another origin) with a 307."""

    mode = "plain"
    other = ""
    keys_seen: list[str] = []  # noqa: RUF012 - one list for the process: what Authorization headers came

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        auth = self.headers.get("Authorization", "")
        _Stub.keys_seen.append(f"{self.server.server_address[1]} {auth}")
        if _Stub.mode == "redirect" and self.server.server_address[1] != int(_Stub.other or 0):
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{_Stub.other}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        content = "7"
        if _Stub.mode == "echo":
            if len(_Stub.keys_seen) % 2:
                return self._send(500, json.dumps({"error": {"message": f"bad header {auth}",
                                                             "headers": dict(self.headers.items())}}).encode())
            content = f"your key: {auth}"
        self._send(200, json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def write_config(folder: Path, runner: str, port: int) -> Path:
    """A config with one local and one API model on a 6-row dataset, every runner forwarding the canary."""
    data = folder / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(6)))
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel, OpenAIAPI
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner, RayRunner, SlurmRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4),
          dict(type=OpenAIAPI, abbr='api', path='m', base_url='http://127.0.0.1:{port}/v1',
               key_env='ORC_CANARY_API_KEY', max_out_len=8, max_connections=2)]
datasets = [dict(type=JsonlDataset, abbr='plus', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator=dict(type='numeric_match')))]
infer = dict(partitioner=dict(type=NaivePartitioner),
             runner=dict({runner}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict({runner}, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def sample_ps(stop: threading.Event, canary: str, hits: list[str]) -> int:
    """Sample ``ps -eo args`` every 50 ms until ``stop``; the lines holding the canary go to ``hits``."""
    samples = 0
    while not stop.is_set():
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout
        hits += [line for line in out.splitlines() if canary in line]
        samples += 1
        stop.wait(0.05)
    return samples


def files_with(root: Path, canary: bytes, newer_than: float | None = None) -> list[tuple[str, bool]]:
    """``(path, others may read it)`` of every regular file under ``root`` that holds ``canary``."""
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 50_000_000:
                    continue
                if newer_than is not None and st.st_mtime < newer_than:
                    continue
                with open(path, "rb") as f:
                    if canary not in f.read():
                        continue
            except OSError:
                continue
            found.append((path, others_can_read(path)))
    return found


def others_can_read(path: str) -> bool:
    """Whether a user other than the file's owner (and not root) may read ``path``: the file and
    every folder above it give read/search to group or others."""
    st = os.stat(path)
    if not st.st_mode & 0o044:
        return False
    folder = os.path.dirname(path)
    while folder not in ("/", ""):
        if not os.stat(folder).st_mode & 0o011:
            return False
        folder = os.path.dirname(folder)
    return True


def slurm_views(prefix: str, canary: str) -> dict[str, int]:
    """Hits of the canary in what ``scontrol`` shows of the jobs whose name starts with ``prefix``."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j"], capture_output=True, text=True,
                         check=False).stdout
    ids = [line.split("|")[0] for line in out.splitlines() if "|" in line and line.split("|")[1].startswith(prefix)]
    views = {"scontrol show job -d": 0, "scontrol write batch_script": 0}
    for job in ids:
        show = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True, text=True, check=False)
        views["scontrol show job -d"] += show.stdout.count(canary)
        script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True, text=True,
                                check=False)
        views["scontrol write batch_script"] += script.stdout.count(canary)
    views["jobs looked at"] = len(ids)
    return views


def state_save_location() -> Path | None:
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    try:
        for line in Path(conf).read_text().splitlines():
            if line.strip().startswith("StateSaveLocation="):
                return Path(line.split("=", 1)[1].strip())
    except OSError:
        pass
    return None


def sweep(kind: str, debug: bool, endpoint: str) -> list[tuple[str, str, str]]:
    """One run with ``kind``'s runner; the table rows ``(place, hits, readable by others)``."""
    canary = f"orc-canary-{secrets.token_hex(8)}"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    _Stub.mode, _Stub.other, _Stub.keys_seen = endpoint, str(other.server_address[1]), []
    for srv in (server, other):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="orc-canary-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)  # as a work dir usually is: "readable by other users" then tells the run's own modes
        cfg = write_config(folder, RUNNERS[kind], server.server_address[1])
        env = {**os.environ, "ORC_CANARY_TOKEN": canary, "ORC_CANARY_API_KEY": canary + "-api",
               "RAY_AUTH_MODE": "disabled"}
        start = time.time() - 1
        stop, ps_hits = threading.Event(), []  # type: ignore[var-annotated]
        sampler = threading.Thread(target=sample_ps, args=(stop, canary, ps_hits), daemon=True)
        sampler.start()
        argv = [sys.executable, "run.py", str(cfg), *(["--debug"] if debug else [])]
        res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
        stop.set()
        sampler.join()
        server.shutdown()
        other.shutdown()
        rows.append(("requests to the endpoint with the API key", str(sum(
            f"{server.server_address[1]} Bearer {canary}-api" == k for k in _Stub.keys_seen)), "-"))
        rows.append(("requests to another origin (a redirect) with the key", str(sum(
            k.startswith(f"{other.server_address[1]} ") and canary in k for k in _Stub.keys_seen)), "-"))
        rows.append(("exit code of the run", str(res.returncode), "-"))
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
        rows.append(("CLI stdout+stderr", str((res.stdout + res.stderr).count(canary)), "-"))
        rows.append(("ps -eo args samples", str(len(ps_hits)), "yes" if ps_hits else "-"))
        run_hits = files_with(folder / "out", canary.encode())
        rows.append(("run folder files", str(len(run_hits)), _readable(run_hits)))
        save = state_save_location()
        tmp_hits = [h for h in files_with(Path("/tmp"), canary.encode(), start)
                    if not h[0].startswith(str(folder / "out")) and not (save and h[0].startswith(f"{save}/"))]
        rows.append(("other files under /tmp (changed during the run; not Slurm's state)", str(len(tmp_hits)),
                     _readable(tmp_hits)))
        for path, readable in run_hits + tmp_hits:
            print(f"  [{kind}] hit: {path} (others may read: {readable})", file=sys.stderr)
        if kind in ("srun", "sbatch"):
            save_hits = files_with(save, canary.encode(), start) if save else []
            rows.append((f"Slurm StateSaveLocation ({save})", str(len(save_hits)), _readable(save_hits)))
            runs = sorted(p for p in (folder / "out").glob("*") if p.is_dir())
            if runs:
                from orchestra.runners.core.naming import run_tag

                views = slurm_views(f"orc-{run_tag(str(runs[-1]))}-", canary)
                for name, count in views.items():
                    rows.append((name, str(count), "-" if name == "jobs looked at" else "yes" if count else "-"))
        if kind == "ray":
            ray_hits = files_with(Path("/tmp/ray"), canary.encode(), start)
            rows.append(("Ray session folders /tmp/ray", str(len(ray_hits)), _readable(ray_hits)))
    return rows


def _readable(hits: list[tuple[str, bool]]) -> str:
    return "yes" if any(r for _, r in hits) else ("no" if hits else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runners", nargs="+", choices=sorted(RUNNERS))
    parser.add_argument("--debug", action="store_true", help="run the CLI with --debug")
    parser.add_argument("--endpoint", choices=("plain", "echo", "redirect"), default="plain",
                        help="how the API model's endpoint behaves (echo, redirect: hostile)")
    args = parser.parse_args()
    print("| runner | endpoint | place | canary hits | readable by other users |\n|---|---|---|---|---|")
    for kind in args.runners:
        for place, hits, readable in sweep(kind, args.debug, args.endpoint):
            print(f"| {kind} | {args.endpoint} | {place} | {hits} | {readable} |", flush=True)


if __name__ == "__main__":
    main()
