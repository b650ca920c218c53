"""RMSNorm as one op with its weight and RoPE in rotate-half form against their previous forms
(docs/history.md, "Fewer ops in a forward, the same bits"): the same logits to the bit on the embedded
pair, and a decode forward's time (4 query rows after 64 cached; old and new taken in turns,
the mean of 100 forwards a turn, 15 turns), eager and on a compiled copy (fast.compile_dynamic:
the compiler fuses these ops itself, so there the two forms should cost about the same). It
prints, a model, whether the logits are equal, then the time of a forward each way.

    python experiments/forward_ops.py
    TORCH_COMPILE_DISABLE=1 python experiments/forward_ops.py --turns 1 --forwards 2   # the flow
"""
import argparse
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
from loading import util  # noqa: E402

SMOKE = "--turns 1 --forwards 2"
SMOKE_OUTPUT = (r"drafter: logits equal to the bit: True(.|\n)*drafter, compiled: a decode forward "
                r"\d+\.\d+ ms before, \d+\.\d+ ms now")


def old_norm(self, x):   # weight * rms_norm(x in fp32), cast back
    return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


def old_rope(x, cos, sin):   # the two halves; cos and sin given once (the first half)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[..., :x.shape[-1] // 2], sin[..., :x.shape[-1] // 2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


NEW, OLD = (model.RMSNorm.forward, model.rope), (old_norm, old_rope)


def use(forms):
    model.RMSNorm.forward, model.rope = forms


def decode_forward(m, forms, compiled):
    """-> a decode forward (4 query rows after 64 cached) of a copy of m in `forms`, warm."""
    use(forms)
    mc = copy.deepcopy(m)
    if compiled:
        torch._dynamo.reset()
        fast.compile_dynamic(mc)
    sess = Session(mc, 4, 512)
    sess.prefill(torch.zeros(64, dtype=torch.long))
    block, pos = torch.full((4,), m.config.mask_token_id), torch.arange(64, 68)

    def forward():
        sess.committed, sess.pending = 64, None
        sess.forward(block, pos, keep=4, rows=torch.arange(4))
    for _ in range(20):
        forward()
    return forward


def in_turns(runs, turns, forwards):
    """{which: seconds a forward, a list of one mean a turn}, the forms taken in turns."""
    took = {which: [] for which in runs}
    for _ in range(turns):
        for which, (forward, forms) in runs.items():
            use(forms)
            t0 = time.perf_counter()
            for _ in range(forwards):
                forward()
            took[which].append((time.perf_counter() - t0) / forwards)
    use(NEW)
    return took


def main(turns=15, forwards=100):
    util.check_positive(turns=turns, forwards=forwards)
    torch.set_num_threads(2)
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, "", (4,))
    ids = torch.randint(4, target.config.vocab_size, (1, 77),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, m in (("target", target), ("drafter", drafter)):
            new = m(ids)
            use(OLD)
            old = m(ids)
            use(NEW)
            print(f"{name}: logits equal to the bit: {torch.equal(new, old)}", flush=True)
            for compiled in (False, True):
                runs = {which: (decode_forward(m, forms, compiled), forms)
                        for which, forms in (("new", NEW), ("old", OLD))}
                took = in_turns(runs, turns, forwards)
                ratio = statistics.median(n / o for n, o in zip(took["new"], took["old"]))
                print(f"{name}, {'compiled' if compiled else 'eager'}: a decode forward "
                      f"{1e3 * statistics.median(took['old']):.3f} ms before, "
                      f"{1e3 * statistics.median(took['new']):.3f} ms now (median of {turns} "
                      f"turns); now / before, the median of the turns' ratios: {ratio:.2f}",
                      flush=True)


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=15, help="turns of old and new (the median)")
    ap.add_argument("--forwards", type=int, default=100, help="forwards a turn (the mean)")
    a = ap.parse_args()
    util.run(lambda: main(a.turns, a.forwards))
