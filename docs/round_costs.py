"""Where a round's time goes (docs/results.md): --spec simsd and --spec spiffy at B = 4, wall
time of each part of their rounds summed over 40 held-out problems, with the forwards
counted, one method after the other (not interleaved), one thread, against threshold
decoding's total. Each part is timed by wrapping the function that does it.

    python docs/round_costs.py
"""
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import decode  # noqa: E402
import speculate  # noqa: E402
import spiffy  # noqa: E402
import verify  # noqa: E402
from prepare import problems  # noqa: E402

torch.set_num_threads(1)
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4,))
rule = cli.make_rule(target, 4, cli.THRESHOLD)
graph = spiffy.load_graph(spiffy.graph_path(cli.DEFAULT_TARGET, rule), rule)
prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(40, "test")]
T, method = defaultdict(float), [""]


def timed(mod, name, key):
    f = getattr(mod, name)

    def wrapped(*a, **k):
        t0 = time.perf_counter()
        out = f(*a, **k)
        T[f"{method[0]}: {key}"] += time.perf_counter() - t0
        return out
    setattr(mod, name, wrapped)


timed(speculate, "draft", "draft (drafter forwards + syncs)")
timed(verify, "verify_copies", "target verification forward")
timed(verify, "walk", "walk (+ ranks for spiffy)")
timed(speculate, "accepted", "count accepted drafts")
timed(spiffy, "draft_copies", "build drafts + copies")
for name, run in (("threshold", lambda ids: decode.generate(target, ids, 64, rule)),
                  ("simsd", lambda ids: speculate.simsd_generate(target, drafter, ids, 64, rule)),
                  ("spiffy", lambda ids: spiffy.spiffy_generate(target, ids, 64, rule, graph))):
    method[0] = name
    run(prompts[0])                                           # warm-up (its parts are counted too)
    t0, counts = time.perf_counter(), defaultdict(int)
    for ids in prompts:
        st = run(ids)[1]
        for k in ("tokens", "nfe", "nfe_draft"):
            counts[k] += st.get(k, 0)
    T[f"{name}: total"] = time.perf_counter() - t0
    for k, v in counts.items():
        T[f"{name}: {k}"] = v
for k, v in T.items():
    print(f"{k:45s} {v:8.3f}")
