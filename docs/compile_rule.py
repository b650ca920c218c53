"""Does compiling the decoding rule pay on this CPU? Threshold decoding on held-out problems
with the target compiled (--compile) twice: with the rule eager and with DecodeRule.__call__
compiled too (dynamic shapes), prompts interleaved, the first pass a warm-up; the tokens must
be the same. docs/results.md, "Compiled against eager in one run, measured".

    python docs/compile_rule.py 40
"""
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import decode  # noqa: E402
from prepare import load_tasks  # noqa: E402

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
target, tok, _ = cli.load_models(cli.DEFAULT_TARGET, "", [4], "cpu", None, "auto")
rule = cli.make_rule(target, 4, cli.THRESHOLD)
step = torch.compile(decode.DecodeRule.__call__, dynamic=True)


class CompiledRule(decode.DecodeRule):
    def __call__(self, logits, block, at_step, generator=None):
        return step(self, logits, block, at_step, generator)


rules = {"rule eager": rule, "rule compiled": CompiledRule(**dataclasses.asdict(rule))}
prompts = [ids for ids, _ in load_tasks(None, n, tok, False)]
seconds = dict.fromkeys(rules, 0.0)
for warm in (True, False):
    for ids in prompts:
        outs = []
        for name, r in rules.items():
            t0 = time.perf_counter()
            outs.append(decode.generate(target, ids, 64, r)[0])
            seconds[name] += 0 if warm else time.perf_counter() - t0
        assert outs[0] == outs[1], "the compiled rule changed the tokens"
print(f"threshold decoding, B = 4, {n} problems, target compiled: " + ", ".join(
    f"{k} {v:.2f} s" for k, v in seconds.items()) + f"; eager rule / compiled rule "
      f"{seconds['rule eager'] / seconds['rule compiled']:.2f}x")
