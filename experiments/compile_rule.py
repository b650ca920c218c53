"""Does compiling the decoding rule pay on this CPU? Each method with the pair compiled
(--compile), once with the rule eager and once with DecodeRule.__call__ compiled too (dynamic
shapes, as fast.compile_model), prompt by prompt in turns; two warm-up passes; the tokens must
be the same. docs/history.md, "A greedy step without a softmax, and one compiled graph for a
step". It prints tokens/s a method, rule eager and compiled, and their ratio.

    python experiments/compile_rule.py --prompts 40 --block-size 4
    TORCH_COMPILE_DISABLE=1 python experiments/compile_rule.py --prompts 1 --max-new-tokens 8   # the flow
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench  # noqa: E402
import cli  # noqa: E402
from decode import DecodeRule  # noqa: E402
from fast import many_graphs  # noqa: E402
from loading import util  # noqa: E402
from measure.graphs import graphs_for  # noqa: E402
from spiffy import DRAFT_BUDGET  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

SMOKE = "--prompts 1 --max-new-tokens 8"
SMOKE_OUTPUT = r"spiffy +rule eager \d+, rule compiled \d+; compiled / eager rule \d\.\d+x"
METHODS = ("threshold", "simsd", "spiffy")


def switchable_rule():
    """-> {how: DecodeRule.__call__ form}, and a list whose one item is the form now used."""
    eager = DecodeRule.__call__
    compiled = many_graphs(torch.compile(eager, dynamic=True, options=dict(cpp_wrapper=True)))
    now = [eager]
    DecodeRule.__call__ = lambda self, *a, **k: now[0](self, *a, **k)
    return {"rule eager": eager, "rule compiled": compiled}, now


def timed_runs(plan, tasks, use, now, n_new):
    """Every method, rule eager and compiled, on every prompt in turns, three passes (the last
    timed) -> (tokens, seconds) by (method, how)."""
    tokens, seconds = {}, {}
    for timed in (False, False, True):
        for ids, _ in tasks:
            for (m, _), (_, run) in plan.items():
                outs = []
                for how, call in use.items():
                    now[0] = call
                    t0 = time.perf_counter()
                    outs.append(run(ids, n_new)[0])
                    took = timed * (time.perf_counter() - t0)
                    seconds[m, how] = seconds.get((m, how), 0) + took
                    tokens[m, how] = tokens.get((m, how), 0) + timed * len(outs[-1])
                if outs[0] != outs[1]:
                    raise AssertionError(f"{m}: the compiled rule changed the tokens")
    return tokens, seconds


def main(prompts=40, B=4, max_new_tokens=64):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    torch.set_num_threads(2)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", [B], "cpu", None, "auto")
    use, now = switchable_rule()
    graphs = graphs_for(cli.DEFAULT_TARGET, target, lambda: None, [])
    plan = bench.plan_runs(METHODS, [B], target, drafter, graphs, None, (), None, DRAFT_BUDGET, cli.DEFAULT_TARGET, {})
    tasks = load_tasks(None, prompts, tok, False)
    tokens, seconds = timed_runs(plan, tasks, use, now, max_new_tokens)
    print(f"B = {B}, {prompts} problems, the pair compiled, tokens/s:")
    for m in METHODS:
        tps = {how: tokens[m, how] / seconds[m, how] for how in use}
        print(f"  {m:10s} " + ", ".join(f"{how} {v:.0f}" for how, v in tps.items()) +
              f"; compiled / eager rule {tps['rule compiled'] / tps['rule eager']:.3f}x")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=40, help="held-out problems")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, a.block_size, a.max_new_tokens))
