"""Every attention rule of the project, as FlexAttention `mask_mod` closures.

A mask_mod is a function (b, h, q_idx, kv_idx) -> bool tensor, True where the query may
attend to the key (FlexAttention's convention). The same closure drives both attention paths:
`flex_attention` through `create_block_mask`, and SDPA through `dense_mask`, which evaluates
it on broadcast aranges. One source of truth, and a free dense reference for the tests.

Closures capture tensors, never Python ints that change from call to call: a captured int is a
constant to torch.compile, so every new value would recompile (0-d tensors do not).

Index convention for the cached forwards (model.py): the keys are [cache ; queries], so the
query q_idx sits at key index `prefix + q_idx`, where `prefix` is the committed cache length.

References: BD3-LM (Arriola et al. 2025) for the block masks, SDAR for block-causal decoding,
SimSD (temporal mask, docs/design.md section 3), Spiffy (draft-graph copies, section 4).
"""
import torch
from torch.nn.attention.flex_attention import create_block_mask


def block_causal(block_size, prefix=0):
    """SDAR's block-causal rule: a token sees its own block and every earlier block.
    `prefix` (the cache length, on the block grid) shifts the queries: prefill uses 0; a
    block decoded against the cache, or [finished block ; next block] (fused commit), uses C."""
    prefix = torch.as_tensor(prefix)

    def block_causal_mask(b, h, q_idx, kv_idx):
        return (q_idx + prefix) // block_size >= kv_idx // block_size
    return block_causal_mask


def simsd_temporal(prefix, n_commit, step, is_slot):
    """SimSD's token-level temporal causal mask (docs/design.md, section 3).

    Queries: [finished block (n_commit rows, fused commit) ; section], keys: [cache ; queries].
    The section holds the data tokens (known, t=0, and drafted, t=tau) and the mask slots, one
    per drafted position with that position's step label (undrafted positions get a slot
    with a label after every drafted step). step, is_slot: (S,) tensors over the section.
      data at t sees data t' <= t and slots t' > t   (the block just after step t)
      slot at t sees data t' <  t and slots t' >= t  (the block just before step t)
    Everyone sees the cache and the finished block; the finished block sees only those.
    """
    shared = torch.as_tensor(prefix + n_commit)   # keys visible to every query
    n_commit = torch.as_tensor(n_commit)

    def simsd_temporal_mask(b, h, q_idx, kv_idx):
        last = step.shape[0] - 1                      # clamp: flex pads indices past the end
        qs = (q_idx - n_commit).clamp(0, last)        # section index of the query
        ks = (kv_idx - shared).clamp(0, last)         # section index of the key
        tq, tk, q_slot, k_slot = step[qs], step[ks], is_slot[qs], is_slot[ks]
        seen_by_data = torch.where(k_slot, tk > tq, tk <= tq)
        seen_by_slot = torch.where(k_slot, tk >= tq, tk < tq)
        in_section = (q_idx >= n_commit) & (kv_idx >= shared)
        rule = torch.where(q_slot, seen_by_slot, seen_by_data)
        return (kv_idx < shared) | (in_section & rule)
    return simsd_temporal_mask


def block_copies(prefix, n_commit, block_size, sees=None):
    """The exact verification mask of Spiffy and of SimSD's default verifier (docs/design.md,
    section 4): queries are [finished blocks (n_commit rows) ; copy_0 ; ... ; copy_n], each copy
    one block long: a state of the current block (Spiffy's graph nodes, or the drafter's states),
    or a state of a later block, reached through complete copies of the blocks before it.
    A copy sees the cache, the finished blocks, itself (bidirectionally) and the copies `sees`
    names: sees[q, k] (a bool tensor, at least n x n; default: the identity) is True where copy
    q sees copy k, its own earlier blocks. The finished blocks are block-causal, as in plain
    decoding. So every copy gets exactly the logits the target computes in that state."""
    shared = torch.as_tensor(prefix + n_commit)
    prefix, n_commit = torch.as_tensor(prefix), torch.as_tensor(n_commit)

    def block_copies_mask(b, h, q_idx, kv_idx):
        qc, kc = (q_idx - n_commit) // block_size, (kv_idx - shared) // block_size
        if sees is None:
            related = qc == kc
        else:                                         # clamp: flex pads indices past the end
            last = sees.shape[0] - 1
            related = sees[qc.clamp(0, last), kc.clamp(0, last)]
        finished = (kv_idx < prefix) | ((kv_idx - prefix) // block_size <= q_idx // block_size)
        return torch.where(q_idx < n_commit, (kv_idx < shared) & finished,   # block-causal
                           (kv_idx < shared) | ((kv_idx >= shared) & related))
    return block_copies_mask


def bd3lm_training(block_size, n):
    """The BD3-LM training mask over [x_t ; x_0] (2n tokens), in the paper's three parts:
    block-diagonal (noisy sees its own noisy block), offset block-causal (noisy block b sees
    clean blocks < b) and block-causal (clean sees clean blocks <= b)."""
    def bd3lm_training_mask(b, h, q_idx, kv_idx):
        q_noisy, kv_noisy = q_idx < n, kv_idx < n
        qb = torch.where(q_noisy, q_idx, q_idx - n) // block_size
        kb = torch.where(kv_noisy, kv_idx, kv_idx - n) // block_size
        block_diagonal = q_noisy & kv_noisy & (qb == kb)
        offset_block_causal = q_noisy & ~kv_noisy & (kb < qb)
        clean_block_causal = ~q_noisy & ~kv_noisy & (kb <= qb)
        return block_diagonal | offset_block_causal | clean_block_causal
    return bd3lm_training_mask


def padded(mask_mod, prefix, n_real, n_pad):
    """Static shapes (model.compile_decoding): the queries padded from `n_real` rows to `n_pad`,
    the keys the whole cache. Every rule above lets each query see the whole committed cache
    (keys < prefix); how the queries see each other is evaluated here, once, into an
    (n_pad, n_pad) table, so that one closure, and one compiled graph a query length, serves
    every rule. A padding query sees the cache and itself (no row is empty); no real query
    sees a padding one."""
    q = torch.arange(n_pad, device=prefix.device)[:, None]
    k = q.T
    table = (mask_mod(0, 0, q, prefix + k) & (k < n_real)) | ((q >= n_real) & (q == k))

    def padded_mask(b, h, q_idx, kv_idx):
        rel = kv_idx - prefix                         # clamp: flex pads indices past the end
        inside = table[q_idx.clamp(0, n_pad - 1), rel.clamp(0, n_pad - 1)] & (rel < n_pad)
        return (rel < 0) | inside
    return padded_mask


def dense_mask(mask_mod, q_len, kv_len, device=None):
    """Evaluate a mask_mod on broadcast aranges: a (q_len, kv_len) bool mask for SDPA."""
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(kv_len, device=device)[None, :]
    return mask_mod(0, 0, q, kv)


def block_mask(mask_mod, q_len, kv_len, device=None):
    """The FlexAttention BlockMask of a mask_mod (shared by every batch row and head)."""
    return create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)


# ---- pictures: `python mask.py` draws every rule above for a small example --------------------
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
         "and itself", block_copies(C, 0, B), 3 * B, C + 3 * B,
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
    import sys

    import util
    ap = util.ArgumentParser(description="Draw every attention rule of the project (B = 4, one "
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
