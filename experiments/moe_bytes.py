"""What a mixture-of-experts forward must read against its query rows: SDAR-30B-A3B next to the
dense SDAR-8B, bf16, and its floor (bytes / bandwidth) on an H100 (3.35 TB/s) and an H200 (4.8).

A dense forward reads every weight whatever its rows; an MoE forward reads its weights outside
the experts (attention, router, head, norms) and every expert any of its rows routes to. The
table is computed from the presets on the meta device (measure/sol.py: forward_bytes), with
the distinct experts a layer reads taken from sol.EXPERTS_HIT_128_8, which --measure
measures: a random-weight MoE of 128 experts, top-8 (a small trunk), on rows shaped as the
decoders' forwards (copies of one block after a shared prompt, each copy revealing another
guess), next to as many independent random rows. A real router's choices are not a random
one's: the counts say how copies share routes, not what SDAR-30B-A3B's router does.

    python experiments/moe_bytes.py             # the table (seconds)
    python experiments/moe_bytes.py --measure   # the expert counts too (a minute on a CPU)
"""
import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loading import util  # noqa: E402
from measure.sol import EXPERTS_HIT_128_8, forward_bytes  # noqa: E402
from model import ModelConfig, SparseMLP, Transformer  # noqa: E402

SMOKE = "--measure --seeds 1 --layers 1 --rows 1,4,16"
SMOKE_OUTPUT = r"16 rows: +[\d.]+ experts of 128[\s\S]*\| 256 \| [\d.]+ \| [\d.]+ \| 16\.4 \|"
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GPUS = {"H100": 3.35e12, "H200": 4.8e12}
MASK = 3


def random_moe(seed, n_layer):
    """128 experts, top-8, a small trunk; weights N(0, 1 / fan_in), embedding N(0, 1)."""
    c = ModelConfig(vocab_size=1000, n_layer=n_layer, n_embd=256, n_head=4, n_kv_head=2,
                    head_dim=64, n_experts=128, top_k=8, moe_intermediate_size=64,
                    norm_topk_prob=True)
    torch.manual_seed(seed)
    model = Transformer(c).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 1 if name == "embed.weight" else 1 / math.sqrt(p.shape[-1]))
    return model


def hits(model, idx, keep):
    """Mean over sparse layers of the distinct experts of the rows `keep` (a (b, T) bool): the
    router's top-k, as SparseMLP.forward takes it."""
    seen, k = [], model.config.top_k
    hook = lambda m, args, logits: seen.append(logits.flatten(0, 1).topk(k).indices)
    handles = [m.router.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, SparseMLP)]
    with torch.no_grad():
        model(idx)
    for h in handles:
        h.remove()
    return sum(len(e[keep.flatten()].unique()) for e in seen) / len(seen)


def copy_rows(n_rows, g, prompt=32, B=4):
    """ceil(n_rows / B) copies of one masked block after a shared prompt, copy i revealing a
    random guess at position i % B (copy 0: none), and the first n_rows block rows of them."""
    n = -(-n_rows // B)
    idx = torch.randint(4, 1000, (1, prompt), generator=g).expand(n, -1)
    block = torch.full((n, B), MASK)
    for i in range(1, n):
        block[i, i % B] = int(torch.randint(4, 1000, (1,), generator=g))
    keep = torch.zeros(n, prompt + B, dtype=torch.bool)
    keep[:, prompt:] = (torch.arange(n * B) < n_rows).view(n, B)
    return torch.cat([idx, block], 1), keep


def random_rows(n_rows, g, prompt=8):
    idx = torch.randint(4, 1000, (n_rows, prompt + 1), generator=g)
    keep = torch.zeros_like(idx, dtype=torch.bool)
    keep[:, -1] = True
    return idx, keep


def measure(seeds, layers, row_counts=ROWS):
    """{rows: (distinct experts, copy-shaped rows; the same, random rows)}, means over seeds."""
    out, models = {}, [random_moe(seed, layers) for seed in range(seeds)]
    for rows in row_counts:
        a = b = 0.0
        for seed, model in enumerate(models):
            g = torch.Generator().manual_seed(seed)
            a += hits(model, *copy_rows(rows, g)) / seeds
            b += hits(model, *random_rows(rows, g)) / seeds
        out[rows] = a, b
        print(f"  {rows:>3} rows: {a:5.1f} experts of 128 (copies), {b:5.1f} (random rows)")
    return out


def table():
    """Bytes read and floor time against rows: the 30B-A3B (copy-shaped and random rows) and
    the dense 8B, bf16."""
    print("| rows | 30B-A3B GB (copies) | 30B-A3B GB (random rows) | 8B GB | "
          + " | ".join(f"{g} ms: 30B-A3B, 8B" for g in GPUS) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(GPUS))
    for rows in ROWS:
        moe, moe_random = forward_bytes("sdar-30b-a3b", rows), forward_bytes("sdar-30b-a3b", rows, False)
        dense = forward_bytes("sdar-8b", rows)
        times = " | ".join(f"{1e3 * moe / bw:.2f}, {1e3 * dense / bw:.2f}" for bw in GPUS.values())
        print(f"| {rows} | {moe / 1e9:.1f} | {moe_random / 1e9:.1f} | {dense / 1e9:.1f} | {times} |")


def main(do_measure=False, seeds=3, layers=4, rows=ROWS):
    if do_measure:
        print(f"distinct experts a sparse layer reads ({seeds} seeds, {layers} layers):")
        got = measure(seeds, layers, rows)
        print("EXPERTS_HIT_128_8 = {" + ", ".join(f"{r}: {a:.1f}" for r, (a, _) in got.items()) + "}")
    print(f"sol.EXPERTS_HIT_128_8 (used below): {EXPERTS_HIT_128_8}")
    table()


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="measure the expert counts too")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="query rows to measure at")
    a = ap.parse_args()
    util.run(lambda: main(do_measure=a.measure, seeds=a.seeds, layers=a.layers,
                          rows=util.int_list(a.rows, "--rows")))
