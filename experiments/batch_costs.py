"""What a batched forward costs (serve/batch.py's Pool.forward) against its requests and rows,
next to what the solo cost table says for as many rows (docs/results.md, "Many prompts in one
forward"): the price a cut across the batch would need. Each request has 120 cached rows and
sends T rows of block-causal queries; the median of `runs` forwards after 5 untimed ones.

    python experiments/batch_costs.py                  # the embedded target, B = 4's table
    python experiments/batch_costs.py --runs 3 --requests 1,2 --rows 4   # seconds (the flow)
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli  # noqa: E402
import mask as masks  # noqa: E402
from loading import util  # noqa: E402
from measure import costs  # noqa: E402
from serve.batch import Call, Pool, Slot  # noqa: E402

SMOKE = "--runs 3 --requests 1,2 --rows 4"
SMOKE_OUTPUT = r" 2 requests x  4 rows =    8 rows: batched +\d+\.\d\d ms, the table's ( *\d+\.\d\d ms|none)"


def main(requests=(1, 4, 8, 16), rows=(4, 8, 16), runs=30, threads=2, block_size=4):
    util.check_positive(runs=runs, threads=threads, block_size=block_size, rows=min(rows), requests=min(requests))
    torch.set_num_threads(threads)
    model, _ = cli.load(cli.DEFAULT_TARGET)
    model.attn_impl = "sdpa"
    cost, how = costs.cost_model(cli.DEFAULT_TARGET, model, block_size)   # None: this CPU has none
    print(f"against {how}")
    start = 120
    for N in requests:
        pool = Pool(model, N)
        pool.reserve(start + max(rows))
        for T in rows:
            calls = [Call(Slot(model, pool, i, None), torch.full((T,), model.config.mask_token_id),
                          torch.arange(start, start + T), start, masks.block_causal(block_size, torch.tensor(start)),
                          T, None) for i in range(N)]
            times = []
            with torch.no_grad():
                for k in range(runs + 5):
                    t0 = time.perf_counter()
                    pool.forward(calls)
                    times.append(time.perf_counter() - t0)
            ms = 1e3 * statistics.median(times[5:])
            table = f"{1e3 * costs.seconds_at(cost.table, N * T):6.2f} ms" if cost else "none"
            print(f"{N:2d} requests x {T:2d} rows = {N * T:4d} rows: batched {ms:6.2f} ms, the table's {table}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,4,8,16", help="requests a forward, comma-separated")
    ap.add_argument("--rows", default="4,8,16", help="query rows a request, comma-separated")
    ap.add_argument("--runs", type=int, default=30, help="timed forwards (the median)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    util.run(lambda: main(util.int_list(a.requests, "--requests"), util.int_list(a.rows, "--rows"), a.runs, a.threads))
