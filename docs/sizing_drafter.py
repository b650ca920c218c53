"""Does sized SimSD lose to every copy because the sizing leaves out the drafter? (docs/results.md, "What
the table says"). The cost table prices a round's verification forward alone (drafts.
worth_verifying maximises expected steps / cost(copies)); but a round that verifies fewer drafts
ends sooner, and every round runs the drafter again (sized: 0.45 / 0.37 drafter forwards a
token at B = 4 / 8, every copy 0.37 / 0.27). This prices each round's drafter too, as a constant
c x cost(1) added to cost(n), and runs `--spec simsd` sized with c = 0 (the shipped sizing),
0.5, 1 and 2, with every copy verified, and `threshold`, interleaved prompt by prompt (2 threads,
a warm-up pass, then `passes` timed ones). The hypothesis predicts that some c > 0 is faster
than c = 0, with fewer drafter forwards a token; it is wrong if c = 0 is as fast as any c > 0.

    python docs/sizing_drafter.py 40 4,8
"""
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import costs  # noqa: E402
from decode import generate  # noqa: E402
from prepare import load_tasks  # noqa: E402
from speculate import simsd_generate  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "4,8").split(",")]
passes, C = 2, (0.0, 0.5, 1.0, 2.0)
torch.set_num_threads(2)
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", sizes, "cpu")
prompts = [ids for ids, _ in load_tasks(None, n, tok, False)]


def priced(cost, c):
    """cost(n) + c x cost(1): a round's verification forward and, roughly, its drafter."""
    def cost_c(k):
        return cost(k) + c * cost(1)
    return cost_c


for B in sizes:
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    cost = costs.cost_model(cli.DEFAULT_TARGET, target, B, None)[0]
    if cost is None:
        sys.exit(f"no cost table for this machine at B = {B} (python costs.py)")
    runs = {"threshold": lambda ids: generate(target, ids, 64, rule)}
    runs |= {f"simsd, c = {c:g}": (lambda ids, c=c: simsd_generate(target, drafter, ids, 64, rule,
                                                                    cost=priced(cost, c))) for c in C}
    runs["simsd, every copy"] = lambda ids: simsd_generate(target, drafter, ids, 64, rule)
    secs, count, ref = defaultdict(float), defaultdict(lambda: defaultdict(int)), {}
    for p in range(1 + passes):
        for i, ids in enumerate(prompts):
            for name, run in runs.items():
                t0 = time.perf_counter()
                out, st = run(ids)
                took = time.perf_counter() - t0
                out = list(out)
                if ref.setdefault(i, out) != out:
                    sys.exit(f"{name} wrote other tokens than threshold on prompt {i}")
                if p:
                    secs[name] += took
                    for k in ("nfe", "nfe_draft"):
                        count[name][k] += st.get(k, 0)
                    count[name]["tokens"] += len(out)
                    count[name]["rounds"] += st.get("rounds", 0)
    print(f"B = {B}, {n} problems, {passes} timed passes (every output = threshold's)")
    print(f"{'':20s}{'x threshold tok/s':>19s}{'tokens/target fwd':>19s}{'drafter fwd/token':>19s}"
          f"{'tokens/round':>14s}")
    rate = {k: count[k]["tokens"] / secs[k] for k in runs}
    for k in runs:
        c = count[k]
        print(f"{k:20s}{rate[k] / rate['threshold']:19.2f}{c['tokens'] / c['nfe']:19.2f}"
              f"{c['nfe_draft'] / c['tokens']:19.2f}"
              f"{c['tokens'] / c['rounds'] if c['rounds'] else 0:14.2f}")
