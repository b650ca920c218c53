"""Speed of light: how close one decode forward, and the whole decode loop, come to the floor.

A decode forward of a block-diffusion LM reads every weight once for B queries, so its floor
is weight bytes / memory bandwidth (the KV cache of a 1k-token context adds little). Here a
checkpoint-shaped model with random weights (a model.PRESETS name, or a checkpoint directory's
config.json) runs
  - one forward of B = 4 / 8 / 32 queries against a cache of `cache_len` rows (and B = 4
    again with 8 x cache_len rows allocated: static shapes attend to every allocated row),
    timed as the median of `iters` after warm-up, next to the floor from the bandwidth
    measured here (a large device-to-device copy);
  - the plain decode loop (`generate`, one token per step, B = 4) after a `cache_len` prompt,
    next to what its forwards alone cost (prefill + NFE x the B = 4 forward): the difference
    is per-step overhead (host syncs, mask building, Python).

    python bench.py --speed-of-light models/target                # CPU, the embedded target
    python bench.py --speed-of-light sdar-8b --device cuda --dtype bfloat16 --compile
"""
import json
import statistics
import time
from pathlib import Path

import torch

import mask as masks
from decode import DecodeRule, Session, generate
from model import PRESETS, ModelConfig, Transformer
from sample import compile_model


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
        config = ModelConfig.from_hf(json.loads((Path(spec) / "config.json").read_text()))
    else:
        raise ValueError(f"--speed-of-light wants a preset ({', '.join(PRESETS)}) or a checkpoint "
                         f"directory, got {spec!r}")
    with torch.device(device):
        return Transformer(config).to(dtype).eval()


@torch.no_grad()
def speed_of_light(spec, device="cpu", dtype=torch.float32, compile=False, cache_len=1024,
                   block_sizes=(4, 8, 32), iters=20, new_tokens=64):
    model = make(spec, device, dtype)
    # a model with a short context (the tiny preset: 1024) gets half of it as the cache
    cache_len = min(cache_len, model.config.max_seq_len // 2)
    if compile:
        compile_model(model, compile)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw, time_it, rows = bandwidth(device), timer(device), []
    forward = {}

    def time_forward(B, cache, allocate=0):   # a decode forward as the decoders run it (Session)
        model.setup_cache(allocate)
        sess = Session(model, B, cache + B)
        sess.committed = cache
        idx = torch.randint(4, model.config.vocab_size, (B,), device=device)
        pos = torch.arange(cache, cache + B, device=device)
        step = lambda: sess.forward(idx, pos, lambda c, n: masks.block_causal(B, c), keep=B)
        time_it(step, 3)                                        # warm-up (and compile)
        forward[B, cache] = t = time_it(step, iters)
        rows.append(dict(block_size=B, cache_len=cache, cache_rows=model.layers[0].attn.cache.k.shape[2],
                         forward_ms=1e3 * t,
                         floor_ms=1e3 * weight_bytes / bw, x_floor=t * bw / weight_bytes))
    for B in block_sizes:
        time_forward(B, cache_len)
    prompt = torch.randint(4, model.config.vocab_size, (cache_len,), device=device)
    prefill = time_it(lambda: model(prompt[None], keep=1), 3)
    rule = DecodeRule(model.config.mask_token_id, 4)
    generate(model, prompt, 8, rule, eos_id=-1)                 # warm-up
    nfe = generate(model, prompt, new_tokens, rule, eos_id=-1)[1]["nfe"]
    loop = time_it(lambda: generate(model, prompt, new_tokens, rule, eos_id=-1), 3)
    forwards = prefill + (nfe - 1) * forward[4, cache_len]
    # the same forward with 8x the cache rows allocated (after the loop, which would use them):
    # static shapes attend to every allocated row, dynamic ones to the rows written
    time_forward(block_sizes[0], cache_len, allocate=8 * cache_len)
    result = dict(model=spec, device=str(device), dtype=str(dtype).removeprefix("torch."),
                  compile=compile, torch=torch.__version__, params=sum(p.numel() for p in model.parameters()),
                  weight_gb=weight_bytes / 1e9, bandwidth_gb_s=bw / 1e9, cache_len=cache_len,
                  forwards=rows, loop=dict(new_tokens=new_tokens, nfe=nfe, loop_s=loop,
                                           forwards_s=forwards, x_forwards=loop / forwards),
                  date=time.strftime("%Y-%m-%d"))
    print(f"{spec}: {result['params'] / 1e6:.1f}M parameters, {result['weight_gb']:.3f} GB of "
          f"weights, measured bandwidth {result['bandwidth_gb_s']:.0f} GB/s, cache {cache_len}")
    for r in rows:
        print(f"  decode forward B={r['block_size']:>2}, cache {r['cache_len']} of {r['cache_rows']:>5} rows: "
              f"{r['forward_ms']:8.3f} ms, floor "
              f"{r['floor_ms']:8.3f} ms ({r['x_floor']:.2f}x the floor)")
    print(f"  decode loop (B=4, {new_tokens} tokens, {nfe} forwards): {loop:.3f} s, its forwards "
          f"alone {forwards:.3f} s ({loop / forwards:.2f}x: the rest is per-step overhead)")
    print(json.dumps(result))
    return result
