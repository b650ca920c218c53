"""RMSNorm as one op with its weight and RoPE in rotate-half form against their previous forms
(docs/results.md, "Fewer ops in a forward, the same bits"): the same logits to the bit on the embedded
pair, and a decode forward's time (4 query rows after 64 cached; old and new taken in turns,
the mean of 100 forwards a turn, 15 turns), eager and on a compiled copy (fast.compile_dynamic:
the compiler fuses these ops itself, so there the two forms should cost about the same).

    python experiments/forward_ops.py
"""
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import fast  # noqa: E402
import model  # noqa: E402
from decode import Session  # noqa: E402


def old_norm(self, x):   # weight * rms_norm(x in fp32), cast back
    return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


def old_rope(x, cos, sin):   # the two halves; cos and sin given once (the first half)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[..., :x.shape[-1] // 2], sin[..., :x.shape[-1] // 2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


NEW, OLD = (model.RMSNorm.forward, model.rope), (old_norm, old_rope)
TURNS = 15


def use(forms):
    model.RMSNorm.forward, model.rope = forms


torch.set_num_threads(2)
target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4,))
ids = torch.randint(4, target.config.vocab_size, (1, 77), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    for name, m in (("target", target), ("drafter", drafter)):
        new = m(ids)
        use(OLD)
        old = m(ids)
        use(NEW)
        print(f"{name}: logits equal to the bit: {torch.equal(new, old)}")
        for compiled in (False, True):
            runs = {}
            for which, forms in (("new", NEW), ("old", OLD)):
                use(forms)
                mc = copy.deepcopy(m)
                if compiled:
                    torch._dynamo.reset()
                    fast.compile_dynamic(mc)
                sess = Session(mc, 4, 512)
                sess.prefill(torch.zeros(64, dtype=torch.long))
                block, pos, rows = torch.full((4,), m.config.mask_token_id), torch.arange(64, 68), torch.arange(4)

                def forward(sess=sess, block=block, pos=pos, rows=rows):
                    sess.committed, sess.pending = 64, None
                    sess.forward(block, pos, keep=4, rows=rows)
                for _ in range(20):
                    forward()
                runs[which] = (forward, forms)
            took = {"new": [], "old": []}
            for _ in range(TURNS):
                for which, (forward, forms) in runs.items():
                    use(forms)
                    t0 = time.perf_counter()
                    for _ in range(100):
                        forward()
                    took[which].append((time.perf_counter() - t0) / 100)
            use(NEW)
            ratio = statistics.median(n / o for n, o in zip(took["new"], took["old"]))
            print(f"{name}, {'compiled' if compiled else 'eager'}: a decode forward "
                  f"{1e3 * statistics.median(took['old']):.3f} ms before, "
                  f"{1e3 * statistics.median(took['new']):.3f} ms now (median of {TURNS} turns); "
                  f"now / before, the median of the turns' ratios: {ratio:.2f}")
