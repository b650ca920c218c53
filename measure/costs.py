"""Cost tables: how long a verification forward of n block copies takes, for one device, dtype,
model shape and block size, measured once by an explicit command and saved next to the weights
(like Spiffy's graphs). The decoders size their copies by it (fast.sized, through
fast.cutter) and never time anything themselves, so the same prompt, settings and table
give the same tokens, forwards and stats on every run. Without a table every copy a proposer
makes is verified (its own budget: --gamma and --lookahead, or D*).

    python tools/costs.py --target models/target            # cost_b{4,8,32}_float32_<this CPU>.json
    python tools/costs.py --target ~/SDAR-8B-Chat --device cuda --dtype bfloat16 --block-size 4
"""
import bisect
import itertools
import json
import platform
import re
import time
from datetime import date
from pathlib import Path

import torch

from decode import Session
from verify import Guesses, verify_copies

COPIES = (1, 2, 4, 8, 16)   # the copy counts measured; linear between them and past the last


def device_name(device):
    """The device a table is for: the GPU's name, or the CPU's model and torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or "unknown CPU"
    if Path("/proc/cpuinfo").is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def model_shape(config):
    return (f"{config.n_layer} layers, d {config.n_embd}, heads {config.n_head}/{config.n_kv_head} x "
            f"{config.head_dim}, ffn {config.intermediate_size}, vocab {config.vocab_size}")


def key(model, B):
    """What a table must match to be used for `model` at block size B."""
    w = model.embed.weight
    return dict(device=device_name(w.device), dtype=str(w.dtype).removeprefix("torch."),
                model=model_shape(model.config), block_size=B)


def table_path(target_dir, model, B):
    """Where the table for `model` at B on this device lives: one file a device, so that the
    tables of several machines can sit next to the same weights."""
    k = key(model, B)
    return Path(target_dir) / f"cost_b{B}_{k['dtype']}_{re.sub('[^a-z0-9]+', '-', k['device'].lower())}.json"


def measure(model, B, repeats=5):
    """Seconds of a forward of n = 1, 2, 4, 8, 16 all-mask copies after two blocks of cache, the
    fastest of `repeats` each, taken in turns (1, 2, ..., 16, 1, 2, ...) so that a slow spell of
    the machine spreads over every n; more copies are never cheaper. -> the table (a dict)."""
    device, mask_id = model.embed.weight.device, model.config.mask_token_id
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sess = Session(model, B, 19 * B)
    sess.prefill(torch.zeros(2 * B, dtype=torch.long, device=device))
    pos, times = torch.arange(2 * B, 3 * B, device=device), {n: [] for n in COPIES}
    with torch.no_grad():
        for _ in range(repeats + 1):                                  # the first: a warm-up
            for n in COPIES:
                sync()
                t0 = time.perf_counter()
                verify_copies(sess, Guesses(torch.full((n, B), mask_id, device=device), [B] * n), pos)
                sync()
                times[n].append(time.perf_counter() - t0)
    seconds = list(itertools.accumulate((min(times[n][1:]) for n in COPIES), max))
    return dict(key(model, B), copies=list(COPIES), seconds=seconds, torch=torch.__version__,
                date=date.today().isoformat())


def cost_of(table):
    """A table -> cost(n copies) -> seconds, linear between the measured counts and past them."""
    ns, ts = table["copies"], table["seconds"]

    def cost(n):
        i = min(max(bisect.bisect_left(ns, n), 1), len(ns) - 1)      # the segment n is on (or past)
        return ts[i - 1] + (ts[i] - ts[i - 1]) * (n - ns[i - 1]) / (ns[i] - ns[i - 1])
    cost.table = table
    return cost


def read_table(path):
    """A cost table file, checked: readable JSON with increasing copy counts and positive,
    non-decreasing seconds. -> the table."""
    try:
        t = json.loads(Path(path).read_text())
        ns, ts = t["copies"], t["seconds"]
        ok = (len(ns) == len(ts) >= 2 and all(type(n) is int for n in ns) and ns == sorted(set(ns)) and ns[0] >= 1
              and all(isinstance(x, (int, float)) and x > 0 for x in ts) and ts == sorted(ts))
        if not ok or not all(isinstance(t.get(k), str) for k in ("device", "dtype", "model")):
            raise ValueError
    except OSError as e:
        raise ValueError(f"cost table {path} cannot be read ({e.strerror or type(e).__name__})") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"malformed cost table {path}: it needs device, dtype, model, block_size, "
                         "copies (increasing counts) and seconds (positive, non-decreasing)") from None
    return t


def load(path, model, B):
    """The cost model in `path` for `model` at block size B, refused (one line naming the file and
    what differs) when it was measured for another device, dtype, model shape or block size."""
    t = read_table(path)
    for k, want in key(model, B).items():
        if t.get(k) != want:
            raise ValueError(f"cost table {path} was measured for {k} {t.get(k)!r}, not {want!r}")
    return cost_of(t)


def find(target_dir, model, B):
    """The table next to the weights, if there is one for this device, dtype, model and B.
    -> (cost model or None, in words: which)."""
    path = table_path(target_dir, model, B)
    if not path.is_file():
        others = [p.name for p in sorted(path.parent.glob(f"cost_b{B}_{key(model, B)['dtype']}_*.json"))]
        none = f"no cost table for this device (there: {', '.join(others)})" if others else "no cost table"
        return None, f"{none}; every copy verified (python tools/costs.py --target {target_dir})"
    t = read_table(path)
    if any(t.get(k) != v for k, v in key(model, B).items()):
        return None, f"no cost table for this device ({path.name} is for {t.get('device')})"
    return cost_of(t), f"cost table {path.name} ({t['date']})"


def cost_model(target_dir, model, B, table=None):
    """The cost model copies are sized by at block size B: the cost table `table` (refused if it
    is for another device, dtype, model or B), else the one next to the target's weights for
    this device, if any (costs.py). -> (cost or None: every copy verified, in words: which)."""
    if table is None:
        return find(target_dir, model, B)
    if table == "none":
        return None, "no cost table (--cost-table none): every copy verified"
    cost = load(table, model, B)
    return cost, f"cost table {table} ({cost.table['date']})"
