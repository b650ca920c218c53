"""Speed of light: how close one decode forward, and the whole decode loop, come to the floor.

A decode forward of a block-diffusion LM reads every weight once for B queries, so its floor
is weight bytes / memory bandwidth (a mixture of experts': the bytes outside the experts and of
the experts its rows route to, forward_bytes) (the KV cache of a 1k-token context adds little). Here a
checkpoint-shaped model with random weights (a checkpoint.PRESETS name, or a checkpoint directory's
config.json) runs
  - one forward of B = 4 / 8 / 32 queries against a cache of `cache_len` rows (and B = 4
    again with 8 x cache_len rows allocated: static shapes attend to every allocated row),
    timed as the median of `iters` after warm-up, next to the floor from the bandwidth
    measured here (a large device-to-device copy);
  - each decoder's forward at B = 4 as it runs it, logits at the masked positions only:
    plain decoding's at each step of a block, Spiffy's verification (the block and D* = 8
    guesses), SimSD's (the block and 3 drafted states); alone, and with the rule or the walk
    through the copies (Spiffy's with the ranks its next guesses are built from), next to
    plain decoding's first forward of a block;
  - the plain decode loop (`generate`, one token per step, B = 4) after a `cache_len` prompt,
    next to what its forwards alone cost (prefill + NFE x plain's forwards above, on
    average): the difference is per-step overhead (host syncs, mask building, Python).

    python bench.py --speed-of-light models/target                # CPU, the embedded target
    python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 --compile
    python bench.py --speed-of-light qwen-vocab-2l     # where the head is most of a forward
"""
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from loading import checkpoint
from loading.checkpoint import PRESETS
from decode import DecodeRule, Session, generate, packed_rows
from model import ModelConfig, SparseMLP, Transformer
from parallel import WORLD, is_split
from fast import compile_model
from spiffy import ranks
from verify import Guesses, verify_copies, walk


# A model, not a measurement: what the counted work would cost for SDAR-8B (target) and
# SDAR-1.7B (drafter) in bf16 on an H200, in target-forward equivalents (one memory-bound
# SDAR-8B forward = 1) per token. A forward costs the most of: its weight bytes / bandwidth,
# 2 x params x query rows / peak FLOP/s (spec-sheet peaks; attention and KV reads left out),
# and its launch-bound floor, `layer_s` a layer (a CUDA-graph replay of a layer's dozen-odd
# kernels: binding for the drafter, 28 layers of 0.7 ms of weights, not for the target).
# A host sync idles the GPU for `sync_s` (the host's Python work between reading a result
# and the next launch). layer_s and sync_s are guesses of the right order; a GPU run replaces
# them: sync_s by a round's wall time less its forwards' (experiments/round_costs.py on the GPU),
# layer_s by a drafter-shaped forward (bench.py --speed-of-light sdar-1.7b --compile).
# An MoE target (sdar-30b-a3b) is costed by the bytes its forward reads (forward_bytes); its
# floor, the 1, is then a plain decoding forward of `block` rows.
# On N GPUs (tensor parallelism, parallel.py) each reads 1/N of the split weights and all of the
# rest, and a target layer adds two all-reduces of rows x d in bf16, each `reduce_s` of latency
# plus a ring's 2 (N-1)/N of its bytes over `link` bytes/s (NVLink 4, one direction; both a guess
# of the right order, not measured: this project has no several-GPU machine). The drafter is whole
# on every GPU. `ranks`: as many as torchrun starts (WORLD); the 1 stays one GPU's forward.
GPU_MODEL = dict(pair="SDAR-8B + SDAR-1.7B on " + (f"{WORLD} H200s, the target split" if WORLD > 1 else "an H200")
                 + ", bf16 (modelled)", target="sdar-8b", drafter="sdar-1.7b", bandwidth=4.8e12, flops=989e12,
                 layer_s=30e-6, sync_s=0.2e-3, block=4, ranks=WORLD, link=450e9, reduce_s=10e-6)
# Distinct experts a sparse layer's rows route to, of 128 with top-8, against the rows of a
# forward shaped as the decoders' (copies of one block, each revealing other guesses; measured,
# a random-weight model: python experiments/moe_bytes.py --measure, 3 seeds); between points,
# linear.
EXPERTS_HIT_128_8 = {1: 8.0, 2: 8.8, 4: 10.0, 8: 17.2, 16: 29.8, 32: 47.6, 64: 69.6,
                     128: 93.1, 256: 110.3}


@functools.cache
def preset_params(preset):
    """Parameters and layers of a checkpoint.PRESETS shape, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(ModelConfig(**PRESETS[preset]))
    return sum(p.numel() for p in model.parameters()), model.config.n_layer


@functools.cache
def preset_experts(preset):
    """(parameters outside the experts, one expert's, sparse layers) of a PRESETS shape, on the
    meta device: a 30B model is never built."""
    with torch.device("meta"):
        model = Transformer(ModelConfig(**PRESETS[preset]))
    sparse = [b.mlp for b in model.layers if isinstance(b.mlp, SparseMLP)]
    expert = sum(p[0].numel() for m in sparse[:1] for p in (m.gate, m.up, m.down))
    outside = preset_params(preset)[0] - len(sparse) * model.config.n_experts * expert
    return outside, expert, len(sparse)


def experts_hit(rows, n_experts, top_k, copies=True):
    """Distinct experts of n_experts a sparse layer reads for `rows` query rows: measured on
    copy-shaped rows (EXPERTS_HIT_128_8) where measured, else as if each row drew its top_k
    at random: n_experts (1 - (1 - top_k / n_experts)^rows)."""
    if copies and (n_experts, top_k) == (128, 8):
        xs = sorted(EXPERTS_HIT_128_8)
        i = next((i for i, x in enumerate(xs) if x >= rows), len(xs) - 1)
        (x0, y0), (x1, y1) = [(x, EXPERTS_HIT_128_8[x]) for x in (xs[max(i - 1, 0)], xs[i])]
        return min(n_experts, y0 + (y1 - y0) * (rows - x0) / max(x1 - x0, 1))
    return n_experts * (1 - (1 - top_k / n_experts) ** rows)


def forward_bytes(preset, rows, copies=True, dtype_bytes=2):
    """Weight bytes a forward of `rows` query rows must read: every weight outside the experts
    (attention, router, head, norms), and the experts its rows route to (experts_hit)."""
    c = ModelConfig(**PRESETS[preset])
    if not c.n_experts:
        return dtype_bytes * preset_params(preset)[0]
    outside, expert, sparse = preset_experts(preset)
    return dtype_bytes * (outside + sparse * expert * experts_hit(rows, c.n_experts, c.top_k, copies))


def model_bytes(model, rows):
    """forward_bytes of a built model, in its dtype: its weight bytes less the experts that
    `rows` rows do not route to (experts_hit)."""
    c, params = model.config, list(model.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    sparse = [b.mlp for b in model.layers if isinstance(b.mlp, SparseMLP)]
    unread = c.n_experts - experts_hit(rows, c.n_experts, c.top_k) if sparse else 0
    return total - unread * sum(p[0].numel() * p.element_size()
                                for m in sparse for p in (m.gate, m.up, m.down))


def forward_flops(preset, rows):
    """2 x the parameters a row uses (its top_k experts of a sparse layer) x rows."""
    c = ModelConfig(**PRESETS[preset])
    if not c.n_experts:
        return 2 * preset_params(preset)[0] * rows
    outside, expert, sparse = preset_experts(preset)
    return 2 * (outside + sparse * c.top_k * expert) * rows


def modelled_gpu_cost(rows, rows_draft, tokens, syncs=0, gpu=GPU_MODEL):
    """rows, rows_draft: {query rows: forwards} of the target and the drafter; syncs: host
    syncs -> modelled target-forward equivalents per token (GPU_MODEL)."""
    def cost(preset, counts, N=1):
        return sum(n * forward_s(preset, T, N, gpu) for T, n in counts.items())
    floor = forward_bytes(gpu["target"], gpu["block"]) / gpu["bandwidth"]   # one forward, bf16
    spent = cost(gpu["target"], rows, gpu["ranks"]) + cost(gpu["drafter"], rows_draft) + syncs * gpu["sync_s"]
    return spent / floor / tokens


def forward_s(preset, rows, ranks, gpu=GPU_MODEL):
    """A modelled forward of `rows` query rows on `ranks` GPUs (GPU_MODEL's comment)."""
    n_layer, weights = preset_params(preset)[1], forward_bytes(preset, rows)
    if ranks > 1:   # each reads its part of the split weights and the whole of the rest
        whole = 2 * preset_whole(preset)
        weights = whole + (weights - whole) / ranks
    one = max(weights / gpu["bandwidth"], forward_flops(preset, rows) / ranks / gpu["flops"], n_layer * gpu["layer_s"])
    reduce = gpu["reduce_s"] + 2 * (ranks - 1) / ranks * 2 * rows * PRESETS[preset]["n_embd"] / gpu["link"]
    return one + (ranks > 1) * 2 * n_layer * reduce


@functools.cache
def preset_whole(preset):
    """Parameters of a PRESETS shape every rank holds whole (parallel.is_split's others)."""
    with torch.device("meta"):
        model = Transformer(ModelConfig(**PRESETS[preset]))
    return sum(p.numel() for name, p in model.named_parameters() if not is_split(name))


def timer(device):
    """-> time(fn, iters): median seconds of fn() over iters runs, synchronised on CUDA."""
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)

    def time_it(fn, iters):
        times = []
        for _ in range(iters):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return time_it


def bandwidth(device, n_bytes=1 << 30):
    """Bytes per second of a device-to-device copy (read + write)."""
    x = torch.empty(n_bytes // 4, device=device)
    y = torch.empty_like(x)
    time_it = timer(device)
    time_it(lambda: y.copy_(x), 2)
    return 2 * n_bytes / time_it(lambda: y.copy_(x), 5)


def make(spec, device, dtype):
    """A preset name or a checkpoint directory -> a random model of that shape."""
    if spec in PRESETS:
        config = ModelConfig(**PRESETS[spec])
    elif (Path(spec) / "config.json").is_file():
        config = checkpoint.config_from_hf(json.loads((Path(spec) / "config.json").read_text()))
    else:
        raise ValueError(f"--speed-of-light wants a preset ({', '.join(PRESETS)}) or a checkpoint "
                         f"directory, got {spec!r}")
    with torch.device("meta"):   # built in `dtype` on the device: an 8B model never in fp32
        model = Transformer(config).to(dtype)
    model = model.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    return model.eval()


def verification_copies(B, mask_id, device):
    """[(decoder, the block states its forward carries)] (token ids 4, 5, ...: values change
    no timing): plain's block at each step of a one-token-a-step rule (B, B - 1, ..., 1
    masks); Spiffy's block with one token known and D* = 8 guesses of one more reveal each;
    SimSD's fresh block and 3 drafted states, one reveal each."""
    plain = [torch.tensor([[4] * k + [mask_id] * (B - k)], device=device) for k in range(B)]
    spiffy = torch.full((9, B), mask_id, device=device)
    spiffy[:, 0] = 4
    for i in range(1, 9):
        spiffy[i, 1 + (i - 1) % (B - 1)] = 4 + i
    simsd = torch.full((4, B), mask_id, device=device)
    for k in range(1, 4):
        simsd[k:, k - 1] = 4 + k
    return [("plain", c) for c in plain] + [("spiffy", spiffy), ("simsd", simsd)]


def verification_round(model, name, copies, cache, rule):
    """-> (forward, round) of one decoder on its copies after `cache` committed rows: the
    forward (logits at the masked positions only) and, after it, plain's rule or the walk
    (Spiffy's with the ranks its next guesses are built from, top 4 tokens), with its sync."""
    mask_id, B = rule.mask_id, rule.block_size
    counts = (copies == mask_id).sum(-1).tolist()
    sess = Session(model, B, cache + len(copies) * B)
    sess.committed = cache
    pos = torch.arange(cache, cache + B, device=copies.device)
    if name == "plain":
        def forward():
            return sess.forward(copies[0], pos, keep=B,
                                rows=packed_rows(copies, mask_id, counts[0]))
        return forward, lambda: rule(forward(), copies[0], 0).tolist()
    extra = (lambda lg, cp, st: ranks(lg, st, rule, 4, cp)) if name == "spiffy" else (lambda *a: ())
    g = Guesses(copies, counts)
    forward = lambda: verify_copies(sess, g, pos)
    return forward, lambda: walk(forward(), g, 1, rule, extra=extra)


def time_verification(model, time_it, cache, iters, B=4):
    """Each decoder's forward and round (verification_round) at B = 4, timed interleaved (the
    median of `iters` each), so that a noisy moment hits them alike; against plain's first
    forward of a block (every position masked)."""
    rule, rows, fns = DecodeRule(model.config.mask_token_id, B), [], []
    for name, copies in verification_copies(B, rule.mask_id, model.embed.weight.device):
        fns.append(verification_round(model, name, copies, cache, rule))
        time_it(fns[-1][1], 3)                                  # warm-up (and compile)
        rows.append(dict(decoder=name, copies=len(copies), queries=copies.numel(),
                         logit_rows=int((copies == rule.mask_id).sum())))
    times = [([], []) for _ in fns]
    for _ in range(iters):
        for (forward, round_), (t_forward, t_round) in zip(fns, times):
            t_forward.append(time_it(forward, 1))
            t_round.append(time_it(round_, 1))
    for r, (t_forward, t_round) in zip(rows, times):
        r.update(forward_ms=1e3 * statistics.median(t_forward), round_ms=1e3 * statistics.median(t_round))
        r.update(x_plain=r["forward_ms"] / rows[0]["forward_ms"],
                 round_x_plain=r["round_ms"] / rows[0]["round_ms"])
    return rows


def show(result):
    """speed_of_light's figures, a line each."""
    rows, verification, loop = result["forwards"], result["verification"], result["loop"]
    print(f"{result['model']}: {result['params'] / 1e6:.1f}M parameters, {result['weight_gb']:.3f} GB of "
          f"weights, measured bandwidth {result['bandwidth_gb_s']:.0f} GB/s, cache {result['cache_len']}")
    for r in rows:
        print(f"  decode forward B={r['block_size']:>2}, cache {r['cache_len']} of {r['cache_rows']:>5} rows: "
              f"{r['forward_ms']:8.3f} ms, floor "
              f"{r['floor_ms']:8.3f} ms ({r['x_floor']:.2f}x the floor)")
    for r in verification:
        print(f"  {r['decoder']:>6} forward, B=4, {r['copies']} block(s), logits at {r['logit_rows']:>2} "
              f"of {r['queries']:>2} rows: {r['forward_ms']:8.3f} ms ({r['x_plain']:.2f}x plain's), "
              f"with its {'rule' if r['decoder'] == 'plain' else 'walk'} {r['round_ms']:8.3f} ms "
              f"({r['round_x_plain']:.2f}x)")
    if loop:
        print(f"  decode loop (B=4, {loop['new_tokens']} tokens, {loop['nfe']} forwards): {loop['loop_s']:.3f} s, its "
              f"forwards alone {loop['forwards_s']:.3f} s ({loop['x_forwards']:.2f}x: the rest is per-step overhead)")


@torch.no_grad()
def speed_of_light(spec, device="cpu", dtype=torch.float32, compile=False, cache_len=1024,
                   block_sizes=(4, 8, 32), iters=20, new_tokens=64, quick=False, attention=None):
    """quick: the B = 4 decode forward alone (compiled, an 8B model's one graph, not six);
    attention: "flex" or "sdpa" (None: the model's default)."""
    model = make(spec, device, dtype)
    model.attn_impl = attention
    # a model with a short context (the tiny preset: 1024) gets half of it as the cache
    cache_len = min(cache_len, model.config.max_seq_len // 2)
    if compile:
        compile_model(model, compile)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw, time_it, rows = bandwidth(device), timer(device), []

    def time_forward(B, cache, allocate=0):   # a decode forward as the decoders run it (Session)
        model.setup_cache(allocate)
        sess = Session(model, B, cache + B)
        sess.committed = cache
        idx = torch.randint(4, model.config.vocab_size, (B,), device=device)
        pos = torch.arange(cache, cache + B, device=device)
        step = lambda: sess.forward(idx, pos, keep=B)
        time_it(step, 3)                                        # warm-up (and compile)
        t = time_it(step, iters)
        floor_bytes = model_bytes(model, B)   # an MoE's: the experts B rows route to
        rows.append(dict(block_size=B, cache_len=cache, cache_rows=model.layers[0].attn.cache.k.shape[2],
                         forward_ms=1e3 * t,
                         floor_ms=1e3 * floor_bytes / bw, x_floor=t * bw / floor_bytes))
    for B in block_sizes[:1] if quick else block_sizes:
        time_forward(B, cache_len)
    result = dict(model=spec, device=str(device), dtype=str(dtype).removeprefix("torch."),
                  compile=compile, attention=attention, torch=torch.__version__, params=sum(p.numel() for p in model.parameters()),
                  weight_gb=weight_bytes / 1e9, bandwidth_gb_s=bw / 1e9, cache_len=cache_len,
                  forwards=rows, verification=[], loop=None, date=time.strftime("%Y-%m-%d"))
    if not quick:
        result.update(more_figures(model, time_it, time_forward, cache_len, block_sizes[0], iters, new_tokens))
    show(result)
    print(json.dumps(result))
    return result


def more_figures(model, time_it, time_forward, cache_len, B, iters, new_tokens):
    """speed_of_light's verification forwards and decode loop (and B's forward with 8x the
    cache rows allocated, into `time_forward`'s rows)."""
    device = model.embed.weight.device
    verification = time_verification(model, time_it, cache_len, iters)
    prompt = torch.randint(4, model.config.vocab_size, (cache_len,), device=device)
    prompt[prompt == model.config.mask_token_id] = 4    # (SDAR's mask id lies among the drawn)
    prefill = time_it(lambda: model(prompt[None], keep=1), 3)
    rule = DecodeRule(model.config.mask_token_id, 4)
    generate(model, prompt, 8, rule, eos_id=-1)                 # warm-up
    nfe = generate(model, prompt, new_tokens, rule, eos_id=-1)[1]["nfe"]
    loop = time_it(lambda: generate(model, prompt, new_tokens, rule, eos_id=-1), 3)
    # its forwards: a block's steps compute logits at 4, 3, 2 and 1 masked positions
    forwards = prefill + (nfe - 1) * statistics.mean(r["forward_ms"] / 1e3 for r in verification
                                                     if r["decoder"] == "plain")
    # the same forward with 8x the cache rows allocated (after the loop, which would use them):
    # static shapes attend to every allocated row, dynamic ones to the rows written
    time_forward(B, cache_len, allocate=8 * cache_len)
    return dict(verification=verification, loop=dict(new_tokens=new_tokens, nfe=nfe, loop_s=loop,
                                                      forwards_s=forwards, x_forwards=loop / forwards))
