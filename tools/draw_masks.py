"""Every attention rule of mask.py drawn for a small example (B = 4, one block of cache): a
character grid from the same closures decoding runs, and with --png a picture.

    python tools/draw_masks.py                      # the grids
    python tools/draw_masks.py --png docs/masks.png # and the picture (needs matplotlib)
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mask import block_causal, block_copies, dense_mask, simsd_temporal  # noqa: E402

SMOKE = ""
SMOKE_OUTPUT = r"Plain decoding: a block against the cache.*\n.*\nx0  # # # #\|# # # #"


def draw(mask_mod, q_len, kv_len, q_labels, kv_groups):
    """The mask as a character grid: a row per query (labelled), '#' where it may attend,
    '.' where not; kv_groups: [(name, n_keys), ...] splits the columns with '|'."""
    m = dense_mask(mask_mod, q_len, kv_len).tolist()
    cuts, at = set(), 0
    for _, n in kv_groups:
        at += n
        cuts.add(at)
    width = max(map(len, q_labels))
    head = " " * width + "  " + " ".join(f"{name:<{2 * n - 1}}" for name, n in kv_groups)
    rows = ["".join(("#" if x else ".") + ("|" if k + 1 in cuts and k + 1 < kv_len else " ")
                    for k, x in enumerate(row)) for row in m]
    return "\n".join([head] + [f"{lab:>{width}}  {r}" for lab, r in zip(q_labels, rows)])


def examples(B=4):
    """(title, mask_mod, q_len, kv_len, query labels, key groups) for each rule, with B = 4
    and one block of cache, so that each picture fits a screen."""
    C = B
    step = torch.tensor([0, 1, 2, 3, 1, 2, 3, 0])[:2 * B]          # 1 known, 3 drafted, 3 slots
    is_slot = torch.tensor([False] * B + [True] * (B - 1) + [False])[:2 * B]
    sec = [f"d{i} t={t}" for i, t in enumerate(step[:B].tolist())] + \
          [f"slot{i} t={t}" for i, t in zip(range(1, B), step[B:].tolist())]
    return [
        ("Plain decoding: a block against the cache (block-causal, SDAR)", block_causal(B, C),
         B, C + B, [f"x{i}" for i in range(B)], [("cache", C), ("block", B)]),
        ("Fused commit: [finished block ; next block], block-causal over the two", block_causal(B, C),
         2 * B, C + 2 * B, [f"f{i}" for i in range(B)] + [f"x{i}" for i in range(B)],
         [("cache", C), ("finished", B), ("block", B)]),
        ("SimSD's temporal mask: data section (known t=0, drafted t=1..3) and mask slots",
         simsd_temporal(C, 0, step[:2 * B - 1], is_slot[:2 * B - 1]), 2 * B - 1, C + 2 * B - 1, sec,
         [("cache", C), ("data", B), ("slots", B - 1)]),
        ("Block copies (Spiffy, lossless SimSD): [X_t ; copy 1 ; copy 2], each sees the cache "
         "and itself", block_copies(C, 0, B, torch.eye(3).bool()), 3 * B, C + 3 * B,
         [f"{c}{i}" for c in ("X", "a", "b") for i in range(B)],
         [("cache", C), ("X_t", B), ("copy 1", B), ("copy 2", B)]),
        ("Across the boundary: copy 1 completes the block, copy 2 is the next block after it "
         "(sees copy 1)", block_copies(C, 0, B, torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]]).bool()),
         3 * B, C + 3 * B, [f"{c}{i}" for c in ("X", "a", "n") for i in range(B)],
         [("cache", C), ("X_t", B), ("copy 1", B), ("next", B)]),
    ]


def save_png(path, B=4):
    """The same pictures as one PNG (matplotlib: an optional dependency, for pictures only)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--png needs matplotlib (pip install matplotlib)") from None
    cases = examples(B)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    axes.flat[-1].axis("off")
    for ax, (title, mod, q_len, kv_len, q_labels, kv_groups) in zip(axes.flat, cases):
        ax.imshow(dense_mask(mod, q_len, kv_len).numpy(), cmap="Blues", vmin=0, vmax=1.3)
        ax.set_yticks(range(q_len), q_labels, fontsize=8)
        ax.set_xticks([x - 0.5 for x in range(kv_len)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(q_len)], minor=True)
        ax.grid(which="minor", color="w", lw=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xticks([]), ax.set_title(title.split(":")[0] + " (rows: queries, columns: keys)", fontsize=10)
        at = 0
        for name, n in kv_groups:
            ax.text(at + n / 2 - 0.5, q_len + 0.3, name, ha="center", va="top", fontsize=8)
            at += n
            ax.axvline(at - 0.5, color="k", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    from loading import util
    ap = util.ArgumentParser(description="Draw every attention rule of mask.py (B = 4, one "
                             "block of cache) as a character grid; --png also saves a picture.")
    ap.add_argument("--png", default=None, help="also write the pictures to this PNG (needs matplotlib)")
    a = ap.parse_args()
    if a.png:                       # bad input before anything is printed
        util.run(lambda: util.check_writable(a.png, "--png"))
    for title, mod, q_len, kv_len, q_labels, kv_groups in examples():
        print(f"{title}\n{draw(mod, q_len, kv_len, q_labels, kv_groups)}\n")
    if a.png:
        util.run(lambda: save_png(a.png))
        print(f"wrote {a.png}", file=sys.stderr)
