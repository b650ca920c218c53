"""Where a compiled threshold step's time goes: the target's forward and one step of the rule
(4 masked rows of a B = 4 block after 120 cached rows), four ways, in turns, median of N steps:
both eager; the forward compiled (`--compile`) and the rule eager, as shipped; each compiled
apart (two compiled calls); both in ONE compiled graph. Every way must give the same block.
Then why the shipped decoders cannot take the last way as it stands: the rule compiled over the
step indices of a B = 32 block compiles a graph for each (the step index is read on the host).
docs/history.md, "A greedy step without a softmax, and one compiled graph for a step". It
prints a line a way (us a step), then the graphs the B = 32 rule compiled.

    python experiments/fused_step.py --steps 300
    TORCH_COMPILE_DISABLE=1 python experiments/fused_step.py --steps 2   # the flow
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
import mask as masks  # noqa: E402
from decode import DecodeRule, packed_rows  # noqa: E402
from loading import util  # noqa: E402

SMOKE = "--steps 2"
SMOKE_OUTPUT = (r"one compiled graph +\d+ us\n"
                r"the rule compiled over a B = 32 block's 32 step indices: \d+ graphs")
WARM = 10   # the first turns: warm-up


def ways(target, rule):
    """name -> a threshold step (forward, then the rule) -> the block it writes."""
    block, pos = torch.full((4,), target.config.mask_token_id), torch.arange(120, 124)
    rows = packed_rows(block, rule.mask_id, 4)
    torch._dynamo.decorators.mark_unbacked(rows, 0)     # as decode.Session passes them

    def forward(model):
        return model(block[None], pos, 120, masks.block_causal(4, 120), keep=4, rows=rows)[0]

    def forward_and_rule(model):
        return rule(forward(model), block, 0)
    models = dict(eager=target, compiled=copy.deepcopy(target), fused=copy.deepcopy(target))
    fast.compile_model(models["compiled"])
    compile = dict(dynamic=True, options=dict(cpp_wrapper=True))   # as fast.compile_model on a CPU
    rule_compiled = torch.compile(DecodeRule.__call__, **compile)
    step_compiled = torch.compile(forward_and_rule, **compile)
    prompt = torch.randint(10, 2000, (120,), generator=torch.Generator().manual_seed(0))
    for m in models.values():
        m.setup_cache(512)
        m(prompt[None], torch.arange(120), 0, masks.block_causal(4, 0), keep=0)
    return {"both eager": lambda: forward_and_rule(models["eager"]),
            "forward compiled, rule eager (shipped)": lambda: forward_and_rule(models["compiled"]),
            "each compiled apart":
                lambda: rule_compiled(rule, forward(models["compiled"]), block, 0),
            "one compiled graph": lambda: step_compiled(models["fused"])}


def step_times(steps, n):
    """us a step, by way: every way in turn, n + WARM turns; every way must agree."""
    us = {k: [] for k in steps}
    for i in range(n + WARM):
        out = {}
        for k, f in steps.items():
            t0 = time.perf_counter()
            out[k] = f()
            us[k].append(1e6 * (time.perf_counter() - t0))
        if not all(torch.equal(o, out["both eager"]) for o in out.values()):
            raise AssertionError("the ways disagree")
    return {k: statistics.median(v[WARM:]) for k, v in us.items()}


def graphs_over_step_indices(target):
    """The graphs the rule compiles (backend eager) over a B = 32 block's step indices."""
    rule32 = cli.make_rule(target, 32, cli.THRESHOLD)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    each_step = torch.compile(DecodeRule.__call__, dynamic=True, backend="eager")
    with torch._dynamo.config.patch(recompile_limit=64):
        for step in range(32):
            state = torch.full((32,), rule32.mask_id)
            state[:step] = 7
            each_step(rule32, torch.randn(32 - step, 64), state, step)
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main(steps=300):
    util.check_positive(steps=steps)
    torch.set_num_threads(2)
    target, _, _ = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu")
    rule = cli.make_rule(target, 4, cli.THRESHOLD)
    with torch.no_grad():
        for k, us in step_times(ways(target, rule), steps).items():
            print(f"{k:40s} {us:6.0f} us")
    print(f"the rule compiled over a B = 32 block's 32 step indices: "
          f"{graphs_over_step_indices(target)} graphs")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="steps timed a way (the median)")
    a = ap.parse_args()
    util.run(lambda: main(a.steps))
