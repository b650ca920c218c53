"""What one step of the threshold rule costs right after a forward (docs/results.md, "A greedy
step without a softmax"): the aten ops it dispatches (exact), and its time after an eager and
after a compiled forward of the target (4 masked rows of a B = 4 block after 120 cached; the
median of 400 steps each, taken in turns). To compare two versions of decode.py, run this in a
checkout of each, in turns (`git worktree add`).

    python experiments/rule_cost.py
"""
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


class CountOps(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


torch.set_num_threads(2)
target, _, _ = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu")
rule, block = cli.make_rule(target, 4, cli.THRESHOLD), torch.full((4,), target.config.mask_token_id)


def forward(s):
    s.committed = 120   # the same rows every time: a decode step's forward
    return s.forward(block, torch.arange(120, 124), keep=4)


with torch.no_grad():
    compiled = copy.deepcopy(target)
    fast.compile_model(compiled)
    prompts = [torch.randint(10, 2000, (120,), generator=torch.Generator().manual_seed(i))
               for i in range(8)]
    sessions = {k: [Session(m, 4, 512) for _ in prompts] for k, m in (("eager", target),
                                                                     ("compiled", compiled))}
    for k in sessions:
        for s, ids in zip(sessions[k], prompts):
            s.prefill(ids)
            rule(forward(s), block, 0)
    logits = forward(sessions["eager"][0])
    with CountOps() as ops:
        rule(logits, block, 0)
    us = {k: [] for k in sessions}
    for i in range(400):
        for k in sessions:
            logits = forward(sessions[k][i % len(prompts)])
            t0 = time.perf_counter()
            rule(logits, block, 0)
            us[k].append(1e6 * (time.perf_counter() - t0))
print(f"a threshold step dispatches {ops.n} aten ops; after an eager forward it takes "
      f"{statistics.median(us['eager']):.0f} us, after a compiled one "
      f"{statistics.median(us['compiled']):.0f} us")
