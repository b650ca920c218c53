"""Tokens on 2 ranks (the target split, parallel.py) against one process's, prompt by prompt.

The split target sums its partial outputs in another order than one process does, so its logits
differ in the last bits (tests/test_parallel.py: at most 1e-5 of the largest logit). Decoding is
the same wherever no decision sits on a near-tie. This decodes the held-out arithmetic problems
with the whole target and with the split one, in the same processes, with the same decoder (its
pricing: the split target's), and reports the rate of prompts whose tokens agree, and where each
that differs first differs.

    torchrun --standalone --nproc-per-node 2 experiments/parallel_agreement.py --prompts 200
    torchrun --standalone --nproc-per-node 2 experiments/parallel_agreement.py --prompts 200 --spec none --block-size 8
    torchrun --standalone --nproc-per-node 2 experiments/parallel_agreement.py --prompts 200 --spec simsd \
        --block-size 8 --temperature 0.8

(Run as one process, both sides are the whole target: the flow only.)
"""
import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cli  # noqa: E402
import parallel  # noqa: E402
import sample  # noqa: E402
import torch  # noqa: E402
from training.tasks import problems  # noqa: E402

SMOKE = "--prompts 2 --max-new-tokens 8"
SMOKE_OUTPUT = r"T=0, 8 new tokens, 1 ranks vs one process: 2 of 2 prompts the same"


def main(prompts=200, max_new_tokens=64, spec="simsd", block_size=4, temperature=0.0):
    whole, tok = cli.load(cli.DEFAULT_TARGET)
    dec, _ = sample.load(spec, block_size=block_size, temperature=temperature)   # torchrun: the split target
    split = dec.target
    ids = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(prompts, "test")]
    same, differ = 0, []
    for k, p in enumerate(ids):
        a, b = (dec(p, max_new_tokens, torch.Generator().manual_seed(k), models=(m, dec.drafter))[0]
                for m in (whole, split))
        if a == b:
            same += 1
            continue
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        differ.append((k, i, a[i:i + 3], b[i:i + 3]))
    print(f"{spec} B={block_size} T={temperature:g}, {max_new_tokens} new tokens, {parallel.WORLD} ranks vs one process: "
          f"{same} of {len(ids)} prompts the same ({same / len(ids):.1%})")
    for k, i, a, b in differ:
        print(f"  prompt {k}: first differs at new token {i}: one process {a}, 2 ranks {b}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--spec", default="simsd", choices=("none", "simsd", "spiffy"))
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0, help="prompt k sampled with seed k")
    args = ap.parse_args()
    parallel.run(lambda: main(args.prompts, args.max_new_tokens, args.spec, args.block_size, args.temperature))
