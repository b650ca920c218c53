"""Why SimSD's lookahead past one block changes little at B = 8 and 32 (docs/results.md): counts,
exact on any machine. For each B and K, greedy, threshold rule, 64 new tokens, every copy
verified: how many blocks each round's draft reached, why it stopped there (the drafter's
confidence fell below draft_stop inside a block; a stop id ended a drafted block; it reached
the K + 1 blocks allowed, fewer where max_new_tokens leaves less room), and how many blocks the
target's walk finished. Drafts that reach far but walks that finish few: the target's steps
limit the lookahead; drafts that stop short: the drafter does.
Then --spec simsd as it runs (K = 3, copies sized by the cost tables shipped next to the target,
measured on the 2-core CPU the README names): how many drafted tokens the sizing verifies, with the
drafter stopping where its drafts are no longer worth verifying, and without; and the
drafter forwards an oracle would spend, stopping right after the last draft the round accepts;
how many of the drafts the sizing cut came from the drafter's last forward; and the drafts the
sizing expects accepted (the sum of the products of the drafter's probabilities, its proxy)
against those the walk accepted.

    python docs/lookahead.py 40          # problems
"""
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import costs  # noqa: E402
import speculate  # noqa: E402
from prepare import problems  # noqa: E402

torch.set_num_threads(1)
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4, 8, 32))
reached, finished, why = Counter(), Counter(), Counter()
draft, accept = speculate.draft, speculate.accepted


def drafted(*args, **kw):
    d = draft(*args, **kw)
    reached[len(d.per_block)] += 1
    allowed = kw["lookahead"] + 1
    full = not (d.states(args[1])[-1] == args[3].mask_id).any()
    why["confidence" if not full else "allowed" if len(d.per_block) == allowed else "stop id"] += 1
    why["room"] += allowed < K + 1
    return d


def accepted(g, w):
    out = accept(g, w)
    finished[len(w.crossed)] += 1
    d = g.data
    cut["oracle"] += int(d.tau[out[0] - 1]) if out[0] else 0         # forwards up to the last accepted
    cut["expected"] += float(d.p_draft.gather(-1, d.tokens[:, None]).squeeze(-1).cumprod(0).sum())
    cut["accepted"] += out[0]
    return out


sized, cut = speculate.Draft.sized, Counter()


def verified(d, cost):
    kept = sized(d, cost)
    keep = set(range(len(kept.pos)) if kept.keep is None else kept.keep)
    tau = d.tau.tolist()
    cut["drafted"], cut["verified"] = cut["drafted"] + len(tau), cut["verified"] + len(keep)
    cut["cut in last"] += sum(t == tau[-1] and i not in keep for i, t in enumerate(tau))
    return kept


speculate.draft, speculate.accepted, speculate.Draft.sized = drafted, accepted, verified
torch.set_num_threads(2)          # this machine's shipped tables (made with 2 threads; the script runs 1)
cost = {B: costs.find(cli.DEFAULT_TARGET, target, B) for B in (4, 8, 32)}
torch.set_num_threads(1)
if not all(c for c, _ in cost.values()):
    sys.exit(f"error: {cost[4][1]}")
cost = {B: c for B, (c, _) in cost.items()}
prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(int(sys.argv[1]), "test")]
print("B  K  rounds  tokens/fwd   draft reached 1 / 2 / 3 / 4 blocks   stopped by confidence / stop id / "
      "blocks allowed (of them, fewer for room)   walk finished 0 / 1 / 2 / 3 blocks")
for B in (4, 8, 32):
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    for K in range(4):
        reached.clear(), finished.clear(), why.clear()
        tokens = nfe = 0
        for ids in prompts:
            out, st = speculate.simsd_generate(target, drafter, ids, 64, rule, lookahead=K)
            tokens, nfe = tokens + len(out), nfe + st["nfe"]
        n = sum(reached.values())
        share = lambda c, k: f"{100 * c[k] / n:4.0f}%"      # noqa: E731
        print(f"{B:<2} {K}  {n:6}  {tokens / nfe:10.2f}   " + " / ".join(share(reached, k) for k in range(1, 5))
              + "   " + " / ".join(share(why, k) for k in ("confidence", "stop id", "allowed"))
              + f" ({share(why, 'room').strip()})   " + " / ".join(share(finished, k) for k in range(4)))
print("B  copies               drafted tokens  verified  cut, from the last forward  drafter forwards / token "
      "(oracle)  tokens / target forward  drafts expected / accepted")
for B in (4, 8, 32):
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    for name, stop, size in (("sized, drafter stop", True, True), ("sized, no stop", False, True), ("all", True, False)):
        speculate.draft = drafted if stop else lambda *a, cost=None, **kw: drafted(*a, **kw)
        cut.clear()
        tokens = nfe = nfe_draft = 0
        for ids in prompts:
            out, st = speculate.simsd_generate(target, drafter, ids, 64, rule, cost=cost[B] if size else None)
            tokens, nfe, nfe_draft = tokens + len(out), nfe + st["nfe"], nfe_draft + st["nfe_draft"]
        kept = f"{cut['verified'] / cut['drafted']:8.0%}" if size else "    100%"
        last = f"{cut['cut in last']} of {cut['drafted'] - cut['verified']}" if size else ""
        print(f"{B:<2} {name:20} {cut['drafted'] if size else '':>15}  {kept}  {last:>26}  "
              f"{nfe_draft / tokens:24.3f} ({cut['oracle'] / tokens:.3f})  {tokens / nfe:23.2f}  "
              f"{cut['expected']:.0f} / {cut['accepted']}")
