"""What a matrix product costs against its number of rows on this CPU (docs/history.md,
"Logits only where they are read"):
  - a linear layer of the embedded target's MLP shape (256 -> 768) at 4, 40 and 160 rows:
    where a forward stops being memory-bound here;
  - the LM head at the real Qwen3 vocabulary (151,936 x 256), as x @ W.T and as (W @ x.T).T,
    at 1-36 rows: the first is not monotone in the rows on this CPU.
Medians of 15 runs.

    python experiments/rows.py 2       # threads
"""
import statistics
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)


def median_ms(f, k=15):
    f()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


mlp = torch.nn.Linear(256, 768, bias=False)
for n in (4, 40, 160):
    x = torch.randn(n, 256)
    print(f"linear 256 -> 768, rows {n:>3}: {1e3 * median_ms(lambda: mlp(x), 50):7.0f} us")
W = torch.randn(151936, 256)
for n in (1, 3, 4, 8, 10, 16, 19, 36):
    x = torch.randn(n, 256)
    a = median_ms(lambda: torch.nn.functional.linear(x, W))
    b = median_ms(lambda: torch.mm(W, x.T).T.contiguous())
    print(f"head 151936 x 256, rows {n:>2}: x @ W.T {a:6.1f} ms   (W @ x.T).T {b:6.1f} ms")
