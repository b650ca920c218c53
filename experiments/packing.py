"""What the packed logits buy (docs/results.md): the head run at the masked positions only
(decode.packed_rows), against the head at every row of the forward with the same rows read
after (so the tokens stay the same). Interleaved prompt by prompt, medians of tokens/s,
greedy threshold rule, on the embedded target, for plain decoding and Spiffy at B = 4 and 32.
It prints a line per block size and method: tokens/s each way and their ratio.

    python experiments/packing.py              # 16 held-out problems; ~2 minutes on 2 CPU cores
    python experiments/packing.py --prompts 1 --block-size 4 --max-new-tokens 8   # seconds
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import decode  # noqa: E402
from decode import DecodeRule, generate  # noqa: E402
from loading import util  # noqa: E402
from measure.graphs import graphs_for  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8"
SMOKE_OUTPUT = r"B =  4 spiffy   : packed +\d+ tok/s, every row +\d+ tok/s, every row / packed \d\.\d{3}"
packed = decode.Session.forward


def every_row(self, tokens, pos, mask_for=None, *, keep, rows=None):
    logits = packed(self, tokens, pos, mask_for, keep=keep)     # the head at every kept row
    return logits if rows is None else logits[rows]


def speeds(model, tasks, B, n_new):
    """(method, way) -> tokens/s a prompt, the ways in turns (packed, every row twice, packed)."""
    rule = DecodeRule(model.config.mask_token_id, B, "low_confidence_dynamic")
    graph = graphs_for(cli.DEFAULT_TARGET, model, None, None)(rule)
    runs = (("threshold", lambda ids: generate(model, ids, n_new, rule)),
            ("spiffy", lambda ids: spiffy_generate(model, ids, n_new, rule, graph)))
    speed = {}
    try:
        for prompt, _ in tasks:
            for way in ("packed", "every row", "every row", "packed"):
                decode.Session.forward = packed if way == "packed" else every_row
                for name, run in runs:
                    t0 = time.perf_counter()
                    out, _ = run(prompt)
                    speed.setdefault((name, way), []).append(len(out) / (time.perf_counter() - t0))
    finally:
        decode.Session.forward = packed
    return speed


def main(prompts=16, block_sizes=(4, 32), max_new_tokens=64):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    model, tok = cli.load(cli.DEFAULT_TARGET)
    for B in block_sizes:
        cli.check_block_size(model, B, "target")
    tasks = load_tasks(None, prompts, tok, False)
    with torch.no_grad():
        for B in block_sizes:
            speed = speeds(model, tasks, B, max_new_tokens)
            for name in ("threshold", "spiffy"):
                p, e = (statistics.median(speed[name, way]) for way in ("packed", "every row"))
                print(f"B = {B:2d} {name:9s}: packed {p:6.0f} tok/s, every row {e:6.0f} tok/s, "
                      f"every row / packed {e / p:.3f}", flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="held-out problems")
    ap.add_argument("--block-size", default="4,32", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), a.max_new_tokens))
