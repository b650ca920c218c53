"""What a request's thread costs a batch (serve/batch.py, docs/results.md "Many prompts in one
forward"): the held-out problems decoded alone, by serve.batch at N = 1 (in the caller's thread,
no request thread), and at --batch N with each request's thread on one torch thread (as
serve.batch runs it) or on the caller's count (as it ran before); ways interleaved, the median
of --passes, wall time x alone. The explanation under test: torch's CPU ops run on an OpenMP team
per calling thread, and a team's workers spin a while after each op, so a request thread's team
spins on the cores that the batch's forward (in decode_all's thread) needs. If so, requests on
the caller's count run far slower than on one thread, the two take the same time at --threads 1
(no worker to spin), and the gap shrinks with OMP_WAIT_POLICY=PASSIVE (workers that sleep at once).

    python experiments/batch_threads.py --prompts 32 --passes 7 [--batch 16]
    python experiments/batch_threads.py --prompts 32 --passes 7 --threads 1
    OMP_WAIT_POLICY=PASSIVE python experiments/batch_threads.py --prompts 32 --passes 7
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
from decode import generate  # noqa: E402
from loading import util  # noqa: E402
from serve.batch import decode_all  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

SMOKE = "--prompts 2 --passes 1 --max-new-tokens 8 --batch 2"
SMOKE_OUTPUT = r"alone [\d.]+ s, 2 torch.*\nN = 1: [\d.]+x alone's time, tokens = alone\nN = 2, requests on one thread: .*= alone\nN = 2, requests on 2: .*= alone"


def main(prompts=32, passes=5, block_size=4, max_new_tokens=64, threads=2, batch=4):
    util.check_positive(prompts=prompts, passes=passes, block_size=block_size, max_new_tokens=max_new_tokens, batch=batch)
    torch.set_num_threads(threads)
    tgt, tok, _ = cli.load_models(cli.DEFAULT_TARGET, None, (block_size,))
    rule, ps = cli.make_rule(tgt, block_size, cli.THRESHOLD), [ids for ids, _ in load_tasks(None, prompts, tok, False)]

    def run(p, t, n=None):   # n: the request's thread set to n torch threads first
        if n:
            torch.set_num_threads(n)
        return generate(t, p, max_new_tokens, rule)
    ways = {"alone": lambda: [run(p, tgt) for p in ps], "N = 1": lambda: decode_all(lambda i, p, t: run(p, t), ps, (tgt,), 1)[0],
            f"N = {batch}, requests on one thread": lambda: decode_all(lambda i, p, t: run(p, t), ps, (tgt,), batch)[0],
            f"N = {batch}, requests on {threads}": lambda: decode_all(lambda i, p, t: run(p, t, threads), ps, (tgt,), batch)[0]}
    walls, outs = {k: [] for k in ways}, {}
    for i in range(passes):
        for k in list(ways)[i % len(ways):] + list(ways)[:i % len(ways)]:     # each first in turn
            t0 = time.perf_counter()
            outs[k] = [o for o, _ in ways[k]()]
            walls[k].append(time.perf_counter() - t0)
    wall = {k: statistics.median(w) for k, w in walls.items()}
    print(f"alone {wall['alone']:.2f} s, {threads} torch thread(s)")
    for k in list(ways)[1:]:
        print(f"{k}: {wall[k] / wall['alone']:.2f}x alone's time, tokens {'=' if outs[k] == outs['alone'] else '!='} alone")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=32, help="held-out problems")
    p.add_argument("--passes", type=int, default=5, help="timed passes; the median")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch's threads in the caller")
    p.add_argument("--batch", type=int, default=4, help="requests a forward")
    main(**vars(p.parse_args()))
