"""SimSD's copies sized with and without the drafter's steps (docs/results.md, "States inside a
drafter step"): one interleaved run, prompt by prompt, of `threshold`, `--spec simsd` sized by
this machine's cost table with every drafted state weighed alike (drafts.INSIDE_STEP = 1, as
before), the same with the states inside a drafter step weighed at INSIDE_STEP, and with every
copy verified. Median of the timed repeats per prompt (the first pass is a warm-up); counts
exact. Needs a cost table for this machine (python costs.py).

    python docs/sizing.py 20 4,8          # problems, block sizes
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import costs  # noqa: E402
import decode  # noqa: E402
import drafts  # noqa: E402
import speculate  # noqa: E402
from prepare import load_tasks  # noqa: E402

torch.set_num_threads(2)
n, sizes = int(sys.argv[1]), [int(b) for b in sys.argv[2].split(",")]
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", sizes)
prompts = [ids for ids, _ in load_tasks(None, n, tok, False)]
WEIGHT = drafts.INSIDE_STEP
for B in sizes:
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    cost, how = costs.cost_model(cli.DEFAULT_TARGET, target, B)
    if cost is None:
        sys.exit(f"error: {how}")

    def simsd(weight, cost):
        def run(ids):
            drafts.INSIDE_STEP = weight
            return speculate.simsd_generate(target, drafter, ids, 64, rule, cost=cost)
        return run
    methods = {"threshold": lambda ids: decode.generate(target, ids, 64, rule),
               "simsd, states alike": simsd(1.0, cost), "simsd, by steps": simsd(WEIGHT, cost),
               "simsd, all copies": simsd(WEIGHT, None)}
    times = {m: [[] for _ in prompts] for m in methods}
    counts = {m: dict(tokens=0, nfe=0, nfe_draft=0, rows=0, same=0) for m in methods}
    ref = {}
    for rep in range(3):
        for i, ids in enumerate(prompts):
            for m, run in methods.items():
                t0 = time.perf_counter()
                out, st = run(ids)
                took = time.perf_counter() - t0
                ref.setdefault(i, out)
                if rep:
                    times[m][i].append(took)
                if rep == 1:
                    c = counts[m]
                    c["tokens"] += len(out)
                    c["nfe"], c["nfe_draft"] = c["nfe"] + st["nfe"], c["nfe_draft"] + st.get("nfe_draft", 0)
                    c["rows"] += sum(r * k for r, k in st["rows"].items())
                    c["same"] += out == ref[i]
    rate = {m: counts[m]["tokens"] / sum(statistics.median(t) for t in times[m]) for m in methods}
    print(f"B = {B}, {n} problems, {how}")
    for m, c in counts.items():
        print(f"  {m:20s} {rate[m]:6.0f} tokens/s, x threshold {rate[m] / rate['threshold']:.2f}, "
              f"tokens / target forward {c['tokens'] / c['nfe']:.2f}, drafter forwards / token "
              f"{c['nfe_draft'] / c['tokens']:.3f}, query rows / token {c['rows'] / c['tokens']:.1f}, "
              f"= threshold {c['same']}/{n}")
