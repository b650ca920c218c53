"""Compiling for the command lines (sample.py, bench.py, tools/harness.py): each model's attention
kernel and torch.compile (fast.py's compile_static / compile_dynamic), the warm-up that builds every
graph decoding can reach before anything is timed, and the check that compiled decoding writes
eager's tokens. The default command compiles nothing and leaves each model's attention as it is.
"""
import copy
import logging
import sys
import time
from contextlib import contextmanager

import torch
from torch._dynamo.utils import counters

import fast
import mask as masks
from decode import Session
from measure.pricing import MAX_BUCKET


def set_attention(name, *models):
    """Every model (None skipped) attends with `name` (ATTENTIONS), eager or compiled."""
    for m in models:
        if m is not None and name is not None:
            m.attn_impl = name


def compile_models(target, drafter, how, attention=None):
    """Both models attend with `attention` (None: as they are; ATTENTIONS), eager and compiled.
    --compile `how` for both models (drafter None: none), or "drafter": the drafter alone,
    "auto" (on a CPU its forward then costs about a fifth of the eager target's, against
    about a third eager: docs/history.md, "The drafter compiled alone")."""
    set_attention(attention, target, drafter)
    if how == "drafter":
        if drafter is None:
            raise ValueError("--compile drafter: this method runs no drafter (--spec simsd with one does)")
        return fast.compile_model(drafter, "auto")
    for m in (target, drafter) if how else ():
        if m is not None:
            fast.compile_model(m, how)


def compiled_copies(*models):
    """--compile both: a copy of each model (None stays None), compiled ("auto"), with its own
    cache and graphs but the original's weights (one copy of an 8B model's weights on a GPU)."""
    copies = [m and copy.deepcopy(m, memo={id(p): p for p in m.parameters()}) for m in models]
    for m in filter(None, copies):
        fast.compile_model(m, "auto")
    return copies


def warm_up(runs, prompts, max_new_tokens, block_size, target, drafter=None, max_blocks=2):
    """Compile before anything is timed. Each model's KV cache is sized first, once for the
    process (a cache of another size is new graphs): room for the longest prompt, the
    generation and every decoder's scratch rows. A compiled model runs a forward of each graph
    decoding can reach (warm_buckets: every bucket with static shapes, the target's up to
    max_blocks blocks and the drafter's up to 2; every mask kind with dynamic ones), which a
    later prompt could reach first. Then each of `runs` (ids, n -> decoding) decodes the
    shortest and the longest prompt. -> (seconds, graphs compiled), printed."""
    t0, graphs = time.perf_counter(), counters["stats"]["unique_graphs"]
    ends = sorted(prompts, key=len)
    for model, blocks, kinds in ((target, max_blocks, ("plain", "copies", "ahead", "temporal")),
                                 (drafter, 2, ("plain",))):
        if model is None:
            continue
        # scratch: SimSD's default copies (4 B drafts over 4 blocks), 3 blocks more, static padding
        model.setup_cache(len(ends[-1]) + max_new_tokens + (4 * block_size + 7 + MAX_BUCKET) * block_size)
        if fast.is_compiled(model):
            warm_buckets(model, block_size, blocks, kinds)
    for run in runs:
        for ids in [ends[0]] + [ends[-1]] * (len(ends) > 1):
            run(ids, max_new_tokens)
    seconds, graphs = time.perf_counter() - t0, counters["stats"]["unique_graphs"] - graphs
    print(f"warm-up: {seconds:.1f} s, {graphs} graph(s) compiled")
    return seconds, graphs


@torch.no_grad()
def warm_buckets(model, B, max_blocks, kinds=("plain",)):
    """A forward of each graph decoding can reach. Static shapes: one graph a query-row bucket,
    whatever the mask (fast.padded): 1, 2, 4, ... blocks, up to the one max_blocks needs.
    Dynamic shapes: one graph a mask kind (plain, copies, copies of the next block, temporal),
    whatever the length: one forward of three blocks each."""
    mask_id, device = model.config.mask_token_id, model.embed.weight.device
    sees = torch.ones(16, 16, dtype=torch.bool, device=device).tril()
    step, slot = torch.arange(2 * B, device=device), torch.arange(2 * B, device=device) >= B
    mask_of = dict(plain=lambda prefix, _: masks.block_causal(B, prefix),
                   copies=lambda prefix, n_commit: masks.block_copies(prefix, n_commit, B, sees.diag().diag()),
                   ahead=lambda prefix, n_commit: masks.block_copies(prefix, n_commit, B, sees),
                   temporal=lambda prefix, n_commit: masks.simsd_temporal(prefix, n_commit, step, slot))
    static = "forward" in vars(model)
    sess, blocks = Session(model, B, (2 * MAX_BUCKET + 1) * B), [1 << i for i in range(MAX_BUCKET.bit_length())]
    for n, kind in [(n, "plain") for n in blocks if n < 2 * max_blocks] if static else [(3, k) for k in kinds]:
        tokens = torch.full((n * B,), mask_id, device=device)
        sess.committed = B
        sess.forward(tokens, torch.arange(B, B + len(tokens), device=device), mask_of[kind], keep=B)


@contextmanager
def eager(*models):
    """Inside the block, the models run eager: what fast.compile_static or compile_dynamic
    installed set aside."""
    back = [fast.eager_again(m) for m in models if m is not None]
    try:
        yield
    finally:
        for put_back in back:
            put_back()


def check_compiled(decode, *models):
    """Compiling must not change a token: decode() -> ids, compiled and then eager. In fp32 a
    difference is an error; in bf16 or fp16 (where a forward of another shape may round a
    near-tie the other way) a warning. Compiled decoding on CUDA is known to differ today
    (README, "The GPU check"; tests/test_cuda.py)."""
    compiled = decode()
    with eager(*models):
        plain = decode()
    if compiled == plain:
        return
    where = next(i for i, (a, b) in enumerate(zip(compiled + [None], plain + [None])) if a != b)
    msg = f"compiled decoding gave other tokens than eager from token {where} on"
    if models[0].embed.weight.dtype == torch.float32:
        raise ValueError(msg + "; run without --compile")
    print(f"warning: {msg} (in {models[0].embed.weight.dtype} a near-tie may round either way)",
          file=sys.stderr)


class RecompileLimitHits(logging.Handler):
    """Past its recompile limit, dynamo runs a function eager from then on and says so only
    in its log: collect those messages, so that a "compiled" run that was not is flagged."""

    def __init__(self):
        super().__init__()
        self.hits = []
        logging.getLogger("torch._dynamo").addHandler(self)

    def emit(self, record):
        if record.getMessage().startswith("torch._dynamo hit config."):
            self.hits.append(record.getMessage().splitlines()[0])

    def report(self, counters, after_warmup):
        """Printed and returned: graphs compiled in all and after the warm-up (compiles the
        timed runs paid for), and limit hits (part of the "compiled" run was eager)."""
        logging.getLogger("torch._dynamo").removeHandler(self)
        dynamo = dict(unique_graphs=counters["stats"]["unique_graphs"],
                      graphs_after_warmup=after_warmup,
                      recompile_limit_hits=len(self.hits))
        print(f"torch.compile: {dynamo}")
        if self.hits:
            print(f"WARNING: {self.hits[0]}: part of the 'compiled' run was eager")
        return dynamo
