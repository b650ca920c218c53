"""What a matrix product costs against its number of rows on this CPU (docs/history.md,
"Logits only where they are read"):
  - a linear layer of the embedded target's MLP shape (256 -> 768) at 4, 40 and 160 rows:
    where a forward stops being memory-bound here;
  - the LM head at the real Qwen3 vocabulary (151,936 x 256), as x @ W.T and as (W @ x.T).T,
    at 1-36 rows: the first is not monotone in the rows on this CPU.
Medians of 15 runs (50 for the linear layer). It prints a line per row count.

    python experiments/rows.py --threads 2
    python experiments/rows.py --runs 1 --vocab 1024   # seconds (the flow)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loading import util  # noqa: E402

SMOKE = "--runs 1 --vocab 1024"
SMOKE_OUTPUT = r"head 1024 x 256, rows 36: x @ W.T +\d+\.\d ms +\(W @ x.T\).T +\d+\.\d ms"


def median_ms(f, k=15):
    f()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(threads=2, runs=15, vocab=151936):
    util.check_positive(threads=threads, runs=runs, vocab=vocab)
    torch.set_num_threads(threads)
    mlp = torch.nn.Linear(256, 768, bias=False)
    for n in (4, 40, 160):
        x = torch.randn(n, 256)
        us = 1e3 * median_ms(lambda: mlp(x), max(runs, 50 * runs // 15))
        print(f"linear 256 -> 768, rows {n:>3}: {us:7.0f} us")
    W = torch.randn(vocab, 256)
    for n in (1, 3, 4, 8, 10, 16, 19, 36):
        x = torch.randn(n, 256)
        a = median_ms(lambda: torch.nn.functional.linear(x, W), runs)
        b = median_ms(lambda: torch.mm(W, x.T).T.contiguous(), runs)
        print(f"head {vocab} x 256, rows {n:>2}: x @ W.T {a:6.1f} ms   (W @ x.T).T {b:6.1f} ms")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=15, help="timed runs a product (the median)")
    ap.add_argument("--vocab", type=int, default=151936, help="the head's rows (Qwen3's vocabulary)")
    a = ap.parse_args()
    util.run(lambda: main(a.threads, a.runs, a.vocab))
