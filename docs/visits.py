"""Which of SimSD's verified states the target's walk goes on from (docs/results.md, "States
inside a drafter step"): counts, exact on any machine. The drafter drafts in steps (its best
position and every other above the draft threshold); a round verifies the state after each
drafted token. For each state, greedy, threshold rule, every copy verified (no cost table):
did the walk visit it? Split by where the state sits: at the end of a block, at the end of a
drafter step inside a block, or inside a step. drafts.INSIDE_STEP is about the ratio of the
last to the first two. On training-split problems past the 4000 the drafter was distilled on,
not on the held-out ones the figures are judged on.

    python docs/visits.py 40          # problems
"""
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import speculate  # noqa: E402
from prepare import problems  # noqa: E402

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4, 8, 32))
prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(4000 + n, "train")[4000:]]
seen, visited, B = Counter(), Counter(), None
accepted = speculate.accepted


def counted(g, w):
    """speculate.accepted, counting each drafted state (all copies: state k of a block is
    its k-th copy after the block's first) and whether the walk visited it."""
    d, copy, at = g.data, 0, 0
    ends, hit = d.step_end or [], set(w.visited)
    for nb in d.per_block or [len(d.pos)]:
        for k in range(1, nb + 1):
            kind = "block end" if k == nb else "step end" if ends[at + k - 1] else "inside step"
            seen[B, kind] += 1
            visited[B, kind] += copy + k in hit
        copy, at = copy + nb + 1, at + nb
    return accepted(g, w)


speculate.accepted = counted
for B in (4, 8, 32):
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    for ids in prompts:
        speculate.simsd_generate(target, drafter, ids, 64, rule)
    for kind in ("block end", "step end", "inside step"):
        print(f"B={B:2d} {kind:12s}: visited {visited[B, kind]:4d} of {seen[B, kind]:4d} "
              f"({visited[B, kind] / max(seen[B, kind], 1):.2f})")
