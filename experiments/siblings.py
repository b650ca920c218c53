"""Why SimSD's rounds end, and what the drafter's step siblings buy (docs/results.md, "Siblings"):
counts only, exact on any machine. Held-out problems, greedy, the threshold rule, every copy
verified up to --max-rows query rows (the bench's GPU regime, `--cost-table flat --max-rows 256`).

For each setting it prints tokens a target forward, drafter forwards a token, and how the rounds
that stopped on a state no copy held ended: the target's step against the drafter's next state
from the same copy, "token" (a position both revealed got another token), "set" (the same tokens
where both revealed, but other positions: the drafter revealed what IT was sure of), and "set,
one off" (the two sets differ by one position: what a sibling copy holds). The settings:

  0.5, chain      the drafter's earlier default: it reveals every position above 0.5
  0.9, chain      it reveals as the target's rule does (above 0.9, at least one)
  0.9, siblings   and each drafter step's state also one draft fewer, one more, one swapped

    python experiments/siblings.py --prompts 60
    python experiments/siblings.py --prompts 1 --block-size 4 --max-new-tokens 8   # seconds
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
import verify  # noqa: E402
from loading import util  # noqa: E402
from measure.counts import counting  # noqa: E402
from speculate import DRAFT_STEPS, Settings, simsd_generate  # noqa: E402
from training.tasks import problems  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8"
SMOKE_OUTPUT = r"B= 4 0\.9, siblings: \d+\.\d\d tokens a target forward, \d+\.\d\d drafter forwards a token"
SETTINGS = {"0.5, chain": (0.5, False), "0.9, chain": (0.9, False), "0.9, siblings": (0.9, True)}


def ending(g, w, mask_id):
    """How a round ended (walk w through Guesses g): None if the walk ran out of copies, else how
    the target's last step differs from the drafter's next state from the same copy."""
    then = verify.next_copies(g)
    here = 0 if not w.visited else then[w.visited[-1]]
    if here is None:
        return None
    after, at = g.after or [-1] * len(w.copies), w.copies[here]
    later = [c for c in range(len(w.copies)) if after[c] == after[here] and w.copies[c] != at
             and all(t == mask_id or w.copies[c][i] == t for i, t in enumerate(at))]
    if not later or w.host in [w.copies[c] for c in later]:
        return None
    nxt = max(later, key=lambda c: w.copies[c].count(mask_id))      # the fewest reveals past `at`
    new = lambda s: {i for i, t in enumerate(s) if t != mask_id and at[i] == mask_id}  # noqa: E731
    target, drafter = new(w.host), new(w.copies[nxt])
    if any(w.host[i] != w.copies[nxt][i] for i in target & drafter):
        return "token"
    return "set, one off" if len(target ^ drafter) == 1 else "set"


def line(target, drafter, prompts, rule, n_new, rows, name):
    """One setting's counts over `prompts`."""
    threshold, vary = SETTINGS[name]
    ends, tokens, forwards, drafted = Counter(), 0, 0, 0

    def walk(logits, g, *args):
        w = verify.walk_one_sync(logits, g, *args)
        ends[ending(g, w, rule.mask_id)] += 1
        return w
    s = Settings(draft_threshold=threshold, vary=vary, walk=walk, draft=fast.draft_one_sync,
                 draft_steps=DRAFT_STEPS.get(rule.block_size, 2), cut=fast.cutter(None, rows, rule.block_size))
    for ids in prompts:
        out, st = counting(simsd_generate)(target, drafter, ids, n_new, rule, s)
        tokens, forwards, drafted = tokens + st["tokens"], forwards + st["nfe"], drafted + st["nfe_draft"]
    ended = {k: v for k, v in ends.items() if k}
    return (f"B={rule.block_size:2d} {name}: {tokens / forwards:.2f} tokens a target forward, "
            f"{drafted / tokens:.2f} drafter forwards a token; rounds ending on a state no copy held: "
            f"{ended}, of {sum(ends.values())}")


def main(prompts=60, block_sizes=(4, 8, 32), max_new_tokens=64, max_rows=256):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    torch.set_num_threads(1)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", block_sizes)
    ids = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(prompts, "test")]
    for B in block_sizes:
        rule = cli.make_rule(target, B, cli.THRESHOLD)
        for name in SETTINGS:
            print(line(target, drafter, ids, rule, max_new_tokens, max_rows, name), flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=60, help="held-out problems")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-rows", type=int, default=256, help="the most query rows of copies a forward")
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), a.max_new_tokens, a.max_rows))
