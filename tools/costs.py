"""Measure the cost tables (measure/costs.py, which gives the format) for a checkpoint, one per
block size, next to its weights; or for a model shape with no weights here (a checkpoint.PRESETS
name, random weights), in models/costs/<preset>/:

    python tools/costs.py --target models/target            # cost_b{4,8,32}_float32_<this CPU>.json
    python tools/costs.py --target models/target --drafter models/drafter   # + SimSD's drafting
    python tools/costs.py --target sdar-8b --device cuda --dtype bfloat16 --cache-len 1024
"""
import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import util  # noqa: E402
from loading.checkpoint import PRESETS, from_pretrained  # noqa: E402
from cli import check_block_size, check_device  # noqa: E402
from measure import costs  # noqa: E402
from measure.sol import make  # noqa: E402

SMOKE = "--target {target} --block-size 4 --device cpu --repeats 1"
SMOKE_OUTPUT = r"cost_b4_float32_.*\.json: 4 rows \d+\.\d\d ms, 8 rows "


def main(target="models/target", block_sizes=(4, 8, 32), device="cpu", dtype="float32", repeats=5,
         out=None, cache_len=None, drafter=None):
    """out: the folder the tables go to (default: the target's, or costs.SHAPES/<preset>);
    cache_len: rows of cache before each forward (default: two blocks); drafter: SimSD's
    drafter (a checkpoint directory or a shape), whose drafting each table then holds too."""
    util.check_positive(repeats=repeats)
    if cache_len is not None and cache_len < 0:
        raise ValueError(f"--cache-len must be >= 0, got {cache_len}")
    check_device(device)
    model, drf = (load(m, block_sizes, device, dtype, role) if m else None
                  for m, role in ((target, "target"), (drafter, "drafter")))
    out = Path(out or (costs.SHAPES / target if target in PRESETS else target))
    util.check_writable(out, "--out", folder=True)
    for B in block_sizes:
        if (2 * B if cache_len is None else cache_len) + 17 * B > model.config.max_seq_len:
            raise ValueError(f"--cache-len {cache_len} and 16 copies of {B} overflow the context "
                             f"({model.config.max_seq_len})")
    out.mkdir(parents=True, exist_ok=True)
    for B in block_sizes:
        t = costs.measure(model, B, repeats, cache_len, target)
        t["batch"] = costs.measure_batch(model, B, repeats, cache_len)
        if drf is not None:
            t["draft"] = costs.measure_draft(model, drf, B, repeats, drafter, t)
        path = costs.table_path(out, model, B)
        with util.atomic_write(path) as tmp:
            tmp.write_text(json.dumps(t, indent=1) + "\n")
        print(f"{path}: {', '.join(f'{n} rows {s * 1e3:.2f} ms' for n, s in zip(t['rows'], t['seconds']))}"
              + (f"; a sync {t['sync_s'] * 1e6:.1f} us" if t["sync_s"] is not None else "")
              + f"; a batched round of {t['batch']['requests'][-1]}: {t['batch']['one_s'][-1] * 1e3:.2f} ms"
              + (f"; a drafter step, 0..{len(d['step_s']) - 1} blocks ahead: {' '.join(f'{x * 1e3:.2f}' for x in d['step_s'])}"
                 f" ms, a drafted round {d['round_s'] * 1e3:.2f} ms more" if (d := t.get('draft')) else ""))


def load(target, block_sizes, device, dtype, role):
    """A checkpoint directory's model, or a shape's with random weights (any B times alike)."""
    if target not in PRESETS and not Path(target).is_dir():
        raise ValueError(f"--{role} {target} is neither a checkpoint directory nor a model shape "
                         f"({', '.join(PRESETS)})")
    if target in PRESETS:
        return make(target, device, getattr(torch, dtype))
    model = from_pretrained(target, device=device, dtype=getattr(torch, dtype)).eval()
    for B in block_sizes:
        check_block_size(model, B, role)
    return model


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/target",
                    help=f"checkpoint directory, or a model shape: {', '.join(PRESETS)}")
    ap.add_argument("--out", default=None, help="folder for the tables (default: the checkpoint's, "
                    "or models/costs/<shape>)")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--repeats", type=int, default=5, help="forwards a count, the fastest kept")
    ap.add_argument("--drafter", default=None, help="also time SimSD's drafting with this drafter "
                    "(a checkpoint directory or a shape), which fast.gated weighs")
    ap.add_argument("--cache-len", type=int, default=None, help="rows of KV cache before each "
                    "forward (default: two blocks)")
    a = ap.parse_args()
    util.run(lambda: main(a.target, util.int_list(a.block_size, "--block-size"), a.device, a.dtype,
                          a.repeats, a.out, a.cache_len, a.drafter))
