"""Where decode time goes, per method (docs/results.md, "Where decode time goes"): each part's
own time (exclusive: a part's time excludes the parts it calls), summed over held-out problems,
as shares of the decode time; methods interleaved prompt by prompt, the first pass a warm-up,
the shipped cost tables (2 threads, as bench.py runs). Each part is timed by wrapping the
function that does it, here only: the decoders themselves time nothing.

  target forwards   decode.Session.forward on the target (prefill, rounds, commits)
  drafter forwards  the same on the drafter
  rule              DecodeRule.__call__: the decoding step (plain's, and the walk's)
  walk              verify.walk around the rule: which copy each new state is, host copies
  hint              what the next round's guesses are read from (spiffy.ranks,
                    DecodeRule.best for the drafter-free references)
  proposing         the guesses: the drafter's loop around its forwards (speculate.draft),
                    Spiffy's graph (draft_copies), trajectory / lookup, the drafted states
  loop, rest        everything else: the round loop, commits, stop checks, masks, positions

    python docs/round_costs.py            # B = 4 and 8, 40 problems
    python docs/round_costs.py 20 4,8,32
"""
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import costs  # noqa: E402
import decode  # noqa: E402
import drafts  # noqa: E402
import speculate  # noqa: E402
import spiffy  # noqa: E402
import verify  # noqa: E402
from prepare import load_tasks  # noqa: E402

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "4,8").split(",")]
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", sizes)
prompts = [ids for ids, _ in load_tasks(None, n, tok, False)]
T, stack, where = defaultdict(float), [], [""]


def timed(owner, name, key):
    """Wrap owner.name: its exclusive time goes to key (or key(args) -> key)."""
    f = getattr(owner, name)

    def wrapped(*a, **k):
        stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            took, inner = time.perf_counter() - t0, stack.pop()
            T[(where[0], key(a) if callable(key) else key)] += took - inner
            if stack:
                stack[-1] += took
    setattr(owner, name, wrapped)


timed(decode.Session, "forward", lambda a: "target forwards" if a[0].model is target
      else "drafter forwards")
timed(decode.DecodeRule, "__call__", "rule")
timed(verify, "walk", "walk")
timed(spiffy, "ranks", "hint")
timed(decode.DecodeRule, "best", "hint")
for owner, name in ((speculate, "draft"), (spiffy, "draft_copies"), (speculate, "trajectory"),
                    (speculate, "lookup_draft"), (drafts.Draft, "guesses")):
    timed(owner, name, "proposing")
PARTS = ("target forwards", "drafter forwards", "rule", "walk", "hint", "proposing")

for B in sizes:
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    cost = costs.cost_model(cli.DEFAULT_TARGET, target, B, None)[0]
    graph = spiffy.load_graph(spiffy.graph_path(cli.DEFAULT_TARGET, rule), rule)
    methods = {
        "threshold": lambda ids: decode.generate(target, ids, 64, rule),
        "--spec simsd": lambda ids: speculate.simsd_generate(target, drafter, ids, 64, rule, cost=cost),
        "--spec spiffy": lambda ids: spiffy.spiffy_generate(target, ids, 64, rule, graph, cost=cost),
        "trajectory": lambda ids: speculate.simsd_generate(target, None, ids, 64, rule, cost=cost,
                                                           reference="trajectory"),
        "lookup": lambda ids: speculate.simsd_generate(target, None, ids, 64, rule, cost=cost,
                                                       reference="lookup")}
    total, tokens = defaultdict(float), defaultdict(int)
    for warm in (True, False):
        T.clear()
        for ids in prompts:
            for name, run in methods.items():
                where[0] = name
                t0 = time.perf_counter()
                out, _ = run(ids)
                total[name] += 0 if warm else time.perf_counter() - t0
                tokens[name] += 0 if warm else len(out)
    print(f"B = {B}, {n} problems: each part's share of decode time (ms a token in all)")
    print(f"{'':14s}" + "".join(f"{p:>17s}" for p in PARTS) + f"{'loop, rest':>12s}"
          f"{'outside forwards':>18s}{'ms/token':>10s}")
    for name in methods:
        share = {p: T[(name, p)] / total[name] for p in PARTS}
        rest = 1 - sum(share.values())
        outside = 1 - share["target forwards"] - share["drafter forwards"]
        print(f"{name:14s}" + "".join(f"{share[p]:17.1%}" for p in PARTS) + f"{rest:12.1%}"
              f"{outside:18.1%}{1e3 * total[name] / tokens[name]:10.3f}")
