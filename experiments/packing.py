"""What the packed logits buy (docs/results.md): the head run at the masked positions only
(decode.packed_rows), against the head at every row of the forward with the same rows read
after (so the tokens stay the same). Interleaved prompt by prompt, medians of tokens/s,
greedy threshold rule, on the embedded target, for plain decoding and Spiffy at B = 4 and 32.

    python experiments/packing.py              # 16 held-out problems; ~2 minutes on 2 CPU cores
"""
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import decode  # noqa: E402
from measure.graphs import graphs_for  # noqa: E402
from decode import DecodeRule, generate  # noqa: E402
from training.tasks import load_tasks  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402

model, tok = cli.load(ROOT / "models" / "target")
tasks = load_tasks(None, int(sys.argv[1]) if len(sys.argv) > 1 else 16, tok, False)
packed = decode.Session.forward


def every_row(self, tokens, pos, mask_for, keep, rows=None):
    logits = packed(self, tokens, pos, mask_for, keep)          # the head at every kept row
    return logits if rows is None else logits[rows]


speed = {}
with torch.no_grad():
    for B in (4, 32):
        rule = DecodeRule(model.config.mask_token_id, B, "low_confidence_dynamic")
        graph = graphs_for(ROOT / "models" / "target", model, None, None)(rule)
        for prompt, _ in tasks:
            for mode in ("packed", "every row", "every row", "packed"):
                decode.Session.forward = packed if mode == "packed" else every_row
                for name, run in (("threshold", lambda: generate(model, prompt, 64, rule)),
                                  ("spiffy", lambda: spiffy_generate(model, prompt, 64, rule, graph))):
                    t0 = time.perf_counter()
                    out, _ = run()
                    speed.setdefault((B, name, mode), []).append(len(out) / (time.perf_counter() - t0))
decode.Session.forward = packed
for B in (4, 32):
    for name in ("threshold", "spiffy"):
        p, e = (statistics.median(speed[B, name, m]) for m in ("packed", "every row"))
        print(f"B = {B:2d} {name:9s}: packed {p:6.0f} tok/s, every row {e:6.0f} tok/s, "
              f"every row / packed {e / p:.3f}")
