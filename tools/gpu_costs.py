"""A device's own costs for a model's shape, where no checkpoint need be at hand: random
weights built on the meta device in --dtype (measure/sol.py's make), compiled as decoding
compiles them (--compile static: static shapes, CUDA graphs on CUDA), then
  - one forward of each --rows query rows (logits for every row) after --cache-len cached rows,
    the median of --iters;
  - one host sync: a scalar computed on the device and read back, the median of --iters;
  - the floor: weight bytes over the bandwidth of a device-to-device copy, measured here.
Shapes are done in order, each written to OUT/costs_<shape>.json after every row (a time-out
keeps the rows done); a shape after the first starts only within --budget seconds. The JSON
(rows, seconds, cache length, dtype, device, torch version, sync seconds) is what a cost table
is made from (measure/costs.py).

    python tools/gpu_costs.py --device cuda --out gpu_out            # sdar-8b, then sdar-1.7b
    python tools/gpu_costs.py --device cuda --profile --out gpu_out   # sdar-8b's 4-row forward,
        # by op (compiled with static shapes but no CUDA graphs: a graph replay hides its kernels)
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import fast  # noqa: E402
from decode import Session  # noqa: E402
from loading import util  # noqa: E402
from loading.checkpoint import PRESETS  # noqa: E402
from measure.sol import bandwidth, make, timer  # noqa: E402

SMOKE = "--shapes tiny --rows 4,16 --cache-len 64 --iters 2 --device cpu --dtype float32 --compile none"
SMOKE_OUTPUT = r"tiny +16 rows, cache 64: +[\d.]+ ms[\s\S]*one host sync [\d.]+ us"
COMPILES = ("static", "none")


def step(model, rows, cache_len):
    """One forward of `rows` query rows after `cache_len` committed ones, as decoding runs it."""
    device = model.embed.weight.device
    sess = Session(model, 4, cache_len + rows)
    sess.committed = cache_len
    idx = torch.randint(4, model.config.vocab_size, (rows,), device=device)
    pos = torch.arange(cache_len, cache_len + rows, device=device)
    return lambda: sess.forward(idx, pos, keep=rows)


def sync_seconds(device, iters):
    """A scalar computed on the device and read back on the host: one sync's round trip."""
    x, time_it = torch.zeros((), device=device), timer(device)
    time_it(lambda: (x + 1).item(), 3)
    return time_it(lambda: (x + 1).item(), iters)


def build(shape, device, dtype, compile, attention):
    model = make(shape, device, dtype)
    model.attn_impl = attention
    if compile == "static":
        fast.compile_model(model, "static")
    return model


@torch.no_grad()
def sweep(shape, a, out):
    """One shape's rows -> its JSON's dict, written to `out` after every row."""
    model = build(shape, a.device, getattr(torch, a.dtype), a.compile, a.attention)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = bandwidth(a.device, (1 << 30) if a.device.startswith("cuda") else 1 << 24)
    result = dict(shape=shape, device=device_name(a.device), torch=torch.__version__,
                  triton=triton_version(), dtype=a.dtype, compile=a.compile, attention=a.attention,
                  cache_len=a.cache_len, weight_bytes=weight_bytes, bandwidth_bytes_s=bw,
                  floor_s=weight_bytes / bw, sync_s=sync_seconds(a.device, a.iters), rows=[],
                  date=time.strftime("%Y-%m-%d"))
    time_it = timer(a.device)
    for rows in a.rows:
        fn = step(model, rows, a.cache_len)
        t0 = time.perf_counter()
        time_it(fn, 3)                                     # warm-up: compile, record the graph
        warm = time.perf_counter() - t0
        seconds = time_it(fn, a.iters)
        result["rows"].append(dict(rows=rows, seconds=seconds, x_floor=seconds / result["floor_s"],
                                   warmup_s=warm))
        print(f"{shape} {rows:>4} rows, cache {a.cache_len}: {1e3 * seconds:8.3f} ms "
              f"({seconds / result['floor_s']:.2f}x the floor of {1e3 * result['floor_s']:.3f} ms; "
              f"warm-up {warm:.1f} s)", flush=True)
        with util.atomic_write(out / f"costs_{shape}.json") as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{shape}: one host sync {1e6 * result['sync_s']:.1f} us")
    return result


@torch.no_grad()
def profile(shape, a, out):
    """The by-op profile of one forward of a.rows[0] rows: what the time beyond the floor is."""
    compile = "none" if a.compile == "none" else "static-no-graphs"
    model = make(shape, a.device, getattr(torch, a.dtype))
    model.attn_impl = a.attention
    if compile != "none":
        fast.compile_static(model)
    fn, time_it = step(model, a.rows[0], a.cache_len), timer(a.device)
    time_it(fn, 3)
    acts = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * (
        a.device.startswith("cuda"))
    with torch.profiler.profile(activities=acts) as prof:
        time_it(fn, a.iters)
    key = "cuda_time_total" if a.device.startswith("cuda") else "cpu_time_total"
    text = (f"{shape}, {a.rows[0]} rows, cache {a.cache_len}, {a.dtype}, {device_name(a.device)}, "
            f"torch {torch.__version__}, {compile}, {a.attention}, {a.iters} forwards\n"
            + prof.key_averages().table(sort_by=key, row_limit=30))
    (out / f"profile_{shape}.txt").write_text(text + "\n")
    print(text)


def device_name(device):
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def triton_version():
    try:
        import triton
        return triton.__version__
    except ImportError:
        return None


def parse_args(argv=None):
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="sdar-8b,sdar-1.7b", help=f"presets: {', '.join(PRESETS)}")
    ap.add_argument("--rows", default="4,16,64,256", help="query rows a forward, comma-separated")
    ap.add_argument("--cache-len", type=int, default=1024, help="committed cache rows")
    ap.add_argument("--iters", type=int, default=20, help="timed forwards a row count (median)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=cli.DTYPES)
    ap.add_argument("--compile", default="static", choices=COMPILES)
    ap.add_argument("--attention", default=None, choices=cli.ATTENTIONS,
                    help="default: the command lines' (cli.attention)")
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="seconds: no shape after the first starts past them")
    ap.add_argument("--profile", action="store_true", help="instead: the first shape's forward of "
                    "the first --rows, by op")
    ap.add_argument("--out", default="gpu_out", help="folder for the JSON (and profile) files")
    a = ap.parse_args(argv)
    a.shapes, a.rows = a.shapes.split(","), util.int_list(a.rows, "--rows")
    for s in a.shapes:
        if s not in PRESETS:
            raise ValueError(f"unknown shape {s!r}; choose from {', '.join(PRESETS)}")
    util.check_positive(cache_len=a.cache_len, iters=a.iters)
    cli.check_device(a.device, a.dtype)
    a.attention = cli.attention(a.attention, a.device, a.compile != "none")
    return a


def main(argv=None):
    a, t0 = parse_args(argv), time.perf_counter()
    out = Path(a.out)
    util.check_writable(out, "--out", folder=True)
    out.mkdir(parents=True, exist_ok=True)
    if a.profile:
        return profile(a.shapes[0], a, out)
    for i, shape in enumerate(a.shapes):
        if i and time.perf_counter() - t0 > a.budget:
            print(f"{shape}: not measured ({a.budget:.0f} s budget spent)")
            continue
        sweep(shape, a, out)


if __name__ == "__main__":
    util.run(main)
