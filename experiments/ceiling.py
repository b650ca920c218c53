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

    python experiments/ceiling.py 200          # problems
"""
import sys
from collections import Counter

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
from training.tasks import problems  # noqa: E402
import fast  # noqa: E402
from speculate import Settings, simsd_generate  # noqa: E402
from measure.counts import counting  # noqa: E402
from measure.graphs import graph_path, load_graph  # noqa: E402
from spiffy import spiffy_generate  # noqa: E402

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4, 8, 32))
prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(n, "test")]
for B in (4, 8, 32):
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    graph = load_graph(graph_path(cli.DEFAULT_TARGET, rule), rule)
    tokens = forwards = blocks = ahead = 0
    for ids in prompts:
        out, st = counting(spiffy_generate)(target, ids, 64, rule, graph)
        tokens, forwards, ahead = tokens + st["tokens"], forwards + st["nfe"], ahead + st["blocks_ahead"]
        blocks += -(-(len(ids) % B + st["tokens"] + (st["stop"] == "stop_id")) // B)   # the stop id's too
    prefill = sum(len(ids) >= B for ids in prompts)
    print(f"B={B:2d} spiffy+threshold: {tokens / forwards:.2f} tokens a target forward; at most one "
          f"block a forward allows {tokens / (blocks + prefill):.2f}; {ahead} of {blocks} blocks "
          f"begun by the round before")
    for K in (0, 1, 2):
        tokens, forwards, ends = 0, 0, Counter()
        for ids in prompts:
            out, st = counting(simsd_generate)(target, drafter, ids, 64, rule,
                                               Settings(lookahead=K, draft=fast.draft))
            tokens, forwards = tokens + st["tokens"], forwards + st["nfe"]
            ends.update(st["round_ends"])
        print(f"B={B:2d} simsd lookahead {K}: {tokens / forwards:.2f} tokens a target forward; "
              f"rounds ended: {dict(ends)}")
