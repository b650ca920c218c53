"""Does compiling the decoding rule pay on this CPU? Each method with the pair compiled
(--compile), once with the rule eager and once with DecodeRule.__call__ compiled too (dynamic
shapes, as fast.compile_model), prompt by prompt in turns; two warm-up passes; the tokens must
be the same. docs/results.md, "A greedy step without a softmax, and one compiled graph for a step".

    python experiments/compile_rule.py 40 4
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402
import cli  # noqa: E402
from measure import costs  # noqa: E402
from decode import DecodeRule  # noqa: E402
from fast import many_graphs  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
B = int(sys.argv[2]) if len(sys.argv) > 2 else 4
eager = DecodeRule.__call__
compiled = many_graphs(torch.compile(eager, dynamic=True, options=dict(cpp_wrapper=True)))
use = {"rule eager": eager, "rule compiled": compiled}
now = [eager]
DecodeRule.__call__ = lambda self, *a, **k: now[0](self, *a, **k)

target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", [B], "cpu", None, "auto")
graphs = bench.graphs_for(cli.DEFAULT_TARGET, target, lambda: None, [])
cost = {B: costs.cost_model(cli.DEFAULT_TARGET, target, B)}
methods = ["threshold", "simsd", "spiffy"]
plan = bench.plan_runs(methods, [B], target, drafter, graphs, None, (), None, bench.DRAFT_BUDGET, cost)
tokens, seconds = {}, {}
for timed in (False, False, True):
    for ids, _ in load_tasks(None, n, tok, False):
        for (m, _), (_, run) in plan.items():
            outs = []
            for how, call in use.items():
                now[0] = call
                t0 = time.perf_counter()
                outs.append(run(ids, 64)[0])
                seconds[m, how] = seconds.get((m, how), 0) + timed * (time.perf_counter() - t0)
                tokens[m, how] = tokens.get((m, how), 0) + timed * len(outs[-1])
            assert outs[0] == outs[1], f"{m}: the compiled rule changed the tokens"
print(f"B = {B}, {n} problems, the pair compiled, tokens/s:")
for m in methods:
    tps = {how: tokens[m, how] / seconds[m, how] for how in use}
    print(f"  {m:10s} " + ", ".join(f"{how} {v:.0f}" for how, v in tps.items()) +
          f"; compiled / eager rule {tps['rule compiled'] / tps['rule eager']:.3f}x")
