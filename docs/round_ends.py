"""Why lossless SimSD's rounds end "target chose otherwise" (docs/results.md): counts, exact on
any machine. For each such round (that stayed in its block), greedy, threshold rule,
--lookahead 1, every copy verified: did the target's step reveal a token other than the
drafter's at a drafted position, a position the drafter did not draft, or only the drafter's
tokens but as a set no drafted state holds (another order)?

    python docs/round_ends.py 40          # problems
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
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4, 8))
why = Counter()
orig = speculate.accepted


def wrapped(g, w):
    out = orig(g, w)
    if out[0] < out[1] and not w.crossed:                            # "target chose otherwise"
        d, B, mask_id = g.data, len(w.host), target.config.mask_token_id
        start, drafted = w.copies[0], {}
        for p, t in zip(d.pos.tolist(), d.tokens.tolist()):
            if p < B: drafted[p] = t
        revealed = [(p, t) for p, t in enumerate(w.host) if start[p] == mask_id and t != mask_id]
        if any(p in drafted and drafted[p] != t for p, t in revealed):
            kind = "a token other than the drafter's"
        elif any(p not in drafted for p, _ in revealed):
            kind = "a position the drafter did not draft"
        else:
            kind = "the drafter's tokens, in another order"
        why[(B, kind)] += 1
    return out


speculate.accepted = wrapped
for B in (4, 8):
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    for p in problems(int(sys.argv[1]), "test"):
        ids = tok.encode(f"Question: {p['question']}\nAnswer:")
        speculate.simsd_generate(target, drafter, ids, 64, rule, lookahead=1)
for k, v in sorted(why.items()):
    print(f"B={k[0]}: {k[1]}: {v} rounds")
