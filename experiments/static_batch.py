"""What a static-shape batch (serve.batch.Pool.bucketed: ONE attention call over the whole pool,
the rows padded to a bucket) gives up against decoding alone, on this CPU in fp32 (docs/design.md,
section 8): the largest difference of a row's logits from its solo forward's, and the requests
whose tokens moved, for every decoder, greedy and sampled, every copy verified (--cost-table none:
the widest forwards). Uncompiled here, as gpu_check.sh's dry run runs it; --compile compiles the
buckets with inductor (minutes). If the table did not keep each request to its own keys, the
logits would differ by far more than rounding, and tokens would move.

    python experiments/static_batch.py --prompts 5 --block-size 4,8,32
    python experiments/static_batch.py --prompts 2 --block-size 4 --decoders threshold   # seconds
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fast  # noqa: E402
import sample  # noqa: E402
import serve.batch  # noqa: E402
from decode import Session  # noqa: E402
from loading import util  # noqa: E402
from training.tasks import problems  # noqa: E402

SMOKE = "--prompts 2 --block-size 4 --decoders threshold"
SMOKE_OUTPUT = r"logits: \d+ rows, at most [\d.e+-]+ from alone\nB=4 threshold greedy: 2 of 2 requests"
DECODERS = {"threshold": ("none", {}), "simsd": ("simsd", {}), "simsd-temporal": ("simsd", dict(verifier="temporal", acceptance="paper")),
            "simsd-trajectory": ("simsd", dict(reference="trajectory")),
            "simsd-lookup": ("simsd", dict(reference="lookup")), "spiffy": ("spiffy", {})}


def static(models, compiled):
    """Static shapes installed (compiled or not) -> a function that takes them away again."""
    if not compiled:
        serve.batch.static_trunk = lambda cls, cuda: cls.trunk
    for m in models:
        fast.compile_static(m) if compiled else fast.static_shapes(m, type(m).trunk)
    return lambda: [fast.eager_again(m) for m in models]


@torch.no_grad()
def logits_gap(model, prompts, B, compiled):
    """The most a row's logits moved: each prompt's first open block after its prefill, alone and
    in one bucketed forward with the others."""
    def first_block(i, ids, t):
        sess = Session(t, B, 512)
        sess.prefill(torch.tensor(ids))
        return sess.forward(torch.full((B,), t.config.mask_token_id), torch.arange(len(ids), len(ids) + B), keep=B)
    alone = [first_block(i, p, model) for i, p in enumerate(prompts)]
    undo = static([model], compiled)
    together, _ = serve.batch.decode_all(first_block, prompts, (model,), len(prompts))
    undo()
    return len(prompts) * B, max((a - b).abs().max().item() for a, b in zip(alone, together))


def main(n_prompts=5, block_sizes=(4, 8, 32), decoders=tuple(DECODERS), compiled=False, new_tokens=24):
    util.check_positive(prompts=n_prompts)
    if set(decoders) - set(DECODERS):
        raise ValueError(f"--decoders: choose from {', '.join(DECODERS)}")
    texts = [f"Question: {p['question']}\nAnswer:" for p in problems(n_prompts, "test")]
    for B in block_sizes:
        for name in decoders:
            spec, flags = DECODERS[name]
            for temperature in (0.0, 0.8):
                dec, tok = sample.load(spec, block_size=B, temperature=temperature, cost_table="none", **flags)
                prompts, models = [tok.encode(t) for t in texts], [m for m in dec.models if m is not None]
                if name == decoders[0] and temperature == 0.0:
                    print("logits: %d rows, at most %.1e from alone" % logits_gap(models[0], prompts, B, compiled))
                seeded = lambda i: torch.Generator().manual_seed(i)
                alone = [dec(p, new_tokens, seeded(i))[0] for i, p in enumerate(prompts)]
                undo = static(models, compiled)
                together, pools = serve.batch.decode_all(lambda i, p, t, d: dec(p, new_tokens, seeded(i), models=(t, d)),
                                                         prompts, dec.models, max(1, n_prompts // 2))
                undo()
                same = sum(a == b for a, (b, _) in zip(alone, together))
                print(f"B={B} {name} {'sampled' if temperature else 'greedy'}: {same} of {len(prompts)} requests "
                      f"write their solo tokens; buckets {dict(sorted(pools[0].buckets.items()))}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=5, help="held-out problems, decoded two or more at a time")
    ap.add_argument("--block-size", default="4,8,32")
    ap.add_argument("--decoders", default=",".join(DECODERS), help=f"comma-separated, of {', '.join(DECODERS)}")
    ap.add_argument("--compile", action="store_true", help="the buckets compiled with inductor (static shapes)")
    a = ap.parse_args()
    util.run(lambda: main(a.prompts, util.int_list(a.block_size, "--block-size"), tuple(a.decoders.split(",")), a.compile))
