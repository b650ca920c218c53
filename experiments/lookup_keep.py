"""How often lookup's proposals are kept (counts, no timing): per prompt set and block size,
the rounds where lookup proposed something, and of the k-th proposed token, the share the
walk kept given the k-1 before it were kept. Every copy verified (no cost table).

    python experiments/lookup_keep.py 40          # 40 prompts per set, B = 4, 8, 32
"""
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import variants  # noqa: E402
from measure import counts  # noqa: E402
from training.tasks import load_tasks  # noqa: E402

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
model, tok = cli.load(cli.DEFAULT_TARGET)
real = counts.Counts.lossless
for kind in ("arith", "copy", "text"):
    tasks = load_tasks(None, n, tok, False, kind)
    for B in (4, 8, 32):
        rule, kept, tried, rounds = cli.make_rule(model, B, cli.THRESHOLD), Counter(), Counter(), Counter()

        def lossless(self, g, w):   # a round's drafts accepted (a) of those proposed (of)
            before = dict(self.n)
            real(self, g, w)
            a = next((k[1] for k in self.n if k[0] == "accepted" and self.n[k] != before.get(k)), 0)
            of = max(g.drafted or [0])
            rounds["all"] += 1
            rounds["proposed"] += of > 0
            for k in range(min(a + 1, of)):
                tried[k] += 1
                kept[k] += k < a
        counts.Counts.lossless = lossless
        for ids, _ in tasks:
            variants.simsd(model, None, ids, 64, rule, reference="lookup")
        counts.Counts.lossless = real
        rates = " ".join(f"{kept[k] / tried[k]:.2f}" for k in range(6) if tried[k])
        print(f"{kind:5s} B={B:2d}: proposed in {rounds['proposed']} of {rounds['all']} rounds; "
              f"kept | the ones before kept, tokens 1-6: {rates}")
