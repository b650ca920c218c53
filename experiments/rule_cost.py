"""What one step of the threshold rule costs right after a forward (docs/history.md, "A greedy
step without a softmax"): the aten ops it dispatches (exact), and its time after an eager and
after a compiled forward of the target (4 masked rows of a B = 4 block after 120 cached; the
median of 400 steps each, taken in turns). To compare two versions of decode.py, run this in a
checkout of each, in turns (`git worktree add`). It prints one line: the ops, then the times.

    python experiments/rule_cost.py
    TORCH_COMPILE_DISABLE=1 python experiments/rule_cost.py --steps 2   # the flow
"""
import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
from decode import Session  # noqa: E402
from loading import util  # noqa: E402

SMOKE = "--steps 2"
SMOKE_OUTPUT = (r"a threshold step dispatches \d+ aten ops; after an eager forward it takes \d+ "
                r"us, after a compiled one \d+ us")
PROMPTS = 8


class CountOps(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def sessions(target, forward, rule, block):
    """{"eager", "compiled"}: PROMPTS sessions each, prefilled, a step taken (warm)."""
    compiled = copy.deepcopy(target)
    fast.compile_model(compiled)
    prompts = [torch.randint(10, 2000, (120,), generator=torch.Generator().manual_seed(i))
               for i in range(PROMPTS)]
    out = {k: [Session(m, 4, 512) for _ in prompts] for k, m in (("eager", target),
                                                                 ("compiled", compiled))}
    for k in out:
        for s, ids in zip(out[k], prompts):
            s.prefill(ids)
            rule(forward(s), block, 0)
    return out


def main(steps=400):
    util.check_positive(steps=steps)
    torch.set_num_threads(2)
    target, _, _ = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu")
    rule, block = cli.make_rule(target, 4, cli.THRESHOLD), torch.full((4,), target.config.mask_token_id)

    def forward(s):
        s.committed = 120   # the same rows every time: a decode step's forward
        return s.forward(block, torch.arange(120, 124), keep=4)
    with torch.no_grad():
        runs = sessions(target, forward, rule, block)
        logits = forward(runs["eager"][0])
        with CountOps() as ops:
            rule(logits, block, 0)
        us = {k: [] for k in runs}
        for i in range(steps):
            for k in runs:
                logits = forward(runs[k][i % PROMPTS])
                t0 = time.perf_counter()
                rule(logits, block, 0)
                us[k].append(1e6 * (time.perf_counter() - t0))
    print(f"a threshold step dispatches {ops.n} aten ops; after an eager forward it takes "
          f"{statistics.median(us['eager']):.0f} us, after a compiled one "
          f"{statistics.median(us['compiled']):.0f} us")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400, help="steps timed each way (the median)")
    a = ap.parse_args()
    util.run(lambda: main(a.steps))
