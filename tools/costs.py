"""Measure the cost tables (measure/costs.py) for a checkpoint, one per block size, next to its
weights:

    python tools/costs.py --target models/target            # cost_b{4,8,32}_float32_<this CPU>.json
    python tools/costs.py --target ~/SDAR-8B-Chat --device cuda --dtype bfloat16 --block-size 4
"""
import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import util  # noqa: E402
from loading.checkpoint import from_pretrained  # noqa: E402
from cli import check_block_size, check_device  # noqa: E402
from measure.costs import measure, table_path  # noqa: E402

SMOKE = "--target {target} --block-size 4 --device cpu --repeats 1"
SMOKE_OUTPUT = r"cost_b4_float32_.*\.json: 1: \d+\.\d\d ms, 2: "


def main(target="models/target", block_sizes=(4, 8, 32), device="cpu", dtype="float32", repeats=5):
    util.check_positive(repeats=repeats)
    check_device(device)
    model = from_pretrained(target, device=device, dtype=getattr(torch, dtype)).eval()
    for B in block_sizes:
        check_block_size(model, B, "target")
    util.check_writable(target, "--target", folder=True)
    for B in block_sizes:
        t = measure(model, B, repeats)
        path = table_path(target, model, B)
        with util.atomic_write(path) as tmp:
            tmp.write_text(json.dumps(t, indent=1) + "\n")
        print(f"{path}: {', '.join(f'{n}: {s * 1e3:.2f} ms' for n, s in zip(t['copies'], t['seconds']))}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/target", help="checkpoint directory; tables go next to its weights")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--repeats", type=int, default=5, help="forwards a count, the fastest kept")
    a = ap.parse_args()
    util.run(lambda: main(a.target, util.int_list(a.block_size, "--block-size"), a.device, a.dtype, a.repeats))
