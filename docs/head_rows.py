"""The head's cost against the number of rows on this CPU (docs/results.md, "Logits only where
they are read"): x @ W.T and (W @ x.T).T for a 151,936 x 256 head weight, medians of 15.

    python docs/head_rows.py 2       # threads
"""
import statistics
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
W = torch.randn(151936, 256)


def median_ms(f, k=15):
    f()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


for n in (1, 3, 4, 8, 10, 16, 19, 36):
    x = torch.randn(n, 256)
    a = median_ms(lambda: torch.nn.functional.linear(x, W))
    b = median_ms(lambda: torch.mm(W, x.T).T.contiguous())
    print(f"rows {n:>2}: x @ W.T {a:6.1f} ms   (W @ x.T).T {b:6.1f} ms")
