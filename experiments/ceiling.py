"""How far past the block the speculative decoders get, and what stops them (docs/results.md):
counts only, exact on any machine. On held-out problems, greedy, threshold rule, every copy
verified (no cost model: the counts a GPU's nearly free copies would give):

  - Spiffy: a round can finish its block and take the next block's FIRST step (its drafts of
    block k+1 need block k+1's distribution, which only this forward computes), so it spends
    at least one forward a block. The bound printed is tokens / (blocks + prefill forwards),
    against what it reached, and how many blocks a round went on into.
  - SimSD with lookahead K: why its rounds ended. "target chose otherwise": the target's own
    step was a state the drafter did not pass through; "every draft accepted": the drafter
    stopped (draft_stop, gamma, K).

It prints a line per block size for Spiffy and one per lookahead for SimSD.

    python experiments/ceiling.py --prompts 20
    python experiments/ceiling.py --prompts 1 --block-size 4 --max-new-tokens 8   # seconds
"""
import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
from loading import util  # noqa: E402
from measure.counts import counting  # noqa: E402
from measure.graphs import graph_path, load_graph  # noqa: E402
from speculate import Settings, simsd_generate  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402
from training.tasks import problems  # noqa: E402

SMOKE = "--prompts 1 --block-size 4 --max-new-tokens 8"
SMOKE_OUTPUT = (r"B= 4 spiffy\+threshold: \d+\.\d\d tokens a target forward(.|\n)*"
                r"B= 4 simsd lookahead 2: \d+\.\d\d tokens a target forward; rounds ended: \{")


def spiffy_line(target, prompts, rule, n_new):
    """Spiffy's tokens a target forward against the bound of one block a forward."""
    B = rule.block_size
    graph = load_graph(graph_path(cli.DEFAULT_TARGET, rule), rule)
    tokens = forwards = blocks = ahead = 0
    for ids in prompts:
        out, st = counting(spiffy_generate)(target, ids, n_new, rule, graph)
        tokens, forwards = tokens + st["tokens"], forwards + st["nfe"]
        ahead += st["blocks_ahead"]
        blocks += -(-(len(ids) % B + st["tokens"] + (st["stop"] == "stop_id")) // B)   # the stop id's too
    prefill = sum(len(ids) >= B for ids in prompts)
    return (f"B={B:2d} spiffy+threshold: {tokens / forwards:.2f} tokens a target forward; at most "
            f"one block a forward allows {tokens / (blocks + prefill):.2f}; {ahead} of {blocks} "
            f"blocks begun by the round before")


def simsd_line(target, drafter, prompts, rule, n_new, K):
    """SimSD's tokens a target forward at lookahead K, and why its rounds ended."""
    tokens, forwards, ends = 0, 0, Counter()
    for ids in prompts:
        out, st = counting(simsd_generate)(target, drafter, ids, n_new, rule,
                                           Settings(lookahead=K, draft=fast.draft_one_sync))
        tokens, forwards = tokens + st["tokens"], forwards + st["nfe"]
        ends.update(st["round_ends"])
    return (f"B={rule.block_size:2d} simsd lookahead {K}: {tokens / forwards:.2f} tokens a target "
            f"forward; rounds ended: {dict(ends)}")


def main(prompts=200, block_sizes=(4, 8, 32), max_new_tokens=64):
    util.check_positive(prompts=prompts, max_new_tokens=max_new_tokens)
    torch.set_num_threads(1)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", block_sizes)
    ids = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(prompts, "test")]
    for B in block_sizes:
        rule = cli.make_rule(target, B, cli.THRESHOLD)
        print(spiffy_line(target, ids, rule, max_new_tokens), flush=True)
        for K in (0, 1, 2):
            print(simsd_line(target, drafter, ids, rule, max_new_tokens, K), flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200, help="held-out problems")
    ap.add_argument("--block-size", default="4,8,32", help="comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), a.max_new_tokens))
