"""Every attention rule of decoding (training's: training/objective.py), as `mask_mod` closures.

A mask_mod (b, h, q_idx, kv_idx) -> bool is True where the query may attend to the key. One
closure drives flex_attention (block_mask) and SDPA (dense_mask), and is the tests' dense
reference (python tools/draw_masks.py draws them). Closures capture tensors, never ints (an int
compiles to a constant or a symbol CPU flex mangles: docs/torch_bugs/flex_cpu_symint_rename.py).
Keys are [cache ; queries]: query q_idx is key `prefix + q_idx`. SDAR: block_causal; SimSD's
paper path: simsd_temporal (docs/design.md, 3); the lossless paths: block_copies (4).
"""
import torch
from torch.nn.attention.flex_attention import create_block_mask


def block_causal(block_size, prefix=0):
    """SDAR's block-causal rule: a token sees its own block and every earlier block; `prefix`
    (the cache length, on the block grid) shifts the queries."""
    prefix = torch.as_tensor(prefix)
    block_size = torch.full_like(prefix, block_size)   # a tensor (the module's docstring)

    def block_causal_mask(b, h, q_idx, kv_idx):
        return (q_idx + prefix) // block_size >= kv_idx // block_size
    return block_causal_mask


def simsd_temporal(prefix, n_commit, step, is_slot):
    """SimSD's token-level temporal causal mask. Queries: [finished block (n_commit rows) ;
    section]; the section holds the data tokens (known: t = 0, drafted: t = tau) and one mask
    slot per drafted position with its step label (undrafted ones: after every step).
    step, is_slot: (S,) tensors over the section.
      data at t sees data t' <= t and slots t' > t   (the block just after step t)
      slot at t sees data t' <  t and slots t' >= t  (the block just before step t)
    Everyone sees the cache and the finished block; the finished block sees only those."""
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


def block_copies(prefix, n_commit, block_size, sees):
    """The exact verification mask (Spiffy, SimSD's lossless): queries are [finished blocks
    (n_commit rows: decode.Session's pending commit) ; copy_0 ; ... ; copy_n], each copy a state
    of a block. A copy sees the cache, the finished blocks, and the copies `sees` names (sees[q,
    k], a bool tensor at least n x n: itself, and the copies of the blocks it continues). The
    finished blocks are block-causal. So each copy gets the target's logits in that state."""
    prefix, n_commit = torch.as_tensor(prefix), torch.as_tensor(n_commit)
    shared, block_size = prefix + n_commit, torch.full_like(prefix, block_size)

    def block_copies_mask(b, h, q_idx, kv_idx):
        qc, kc = (q_idx - n_commit) // block_size, (kv_idx - shared) // block_size
        last = sees.shape[0] - 1                      # clamp: flex pads indices past the end
        related = sees[qc.clamp(0, last), kc.clamp(0, last)]
        finished = (kv_idx < prefix) | ((kv_idx - prefix) // block_size <= q_idx // block_size)
        return torch.where(q_idx < n_commit, (kv_idx < shared) & finished,   # block-causal
                           (kv_idx < shared) | ((kv_idx >= shared) & related))
    return block_copies_mask


def dense_mask(mask_mod, q_len, kv_len, device=None):
    """Evaluate a mask_mod on broadcast aranges: a (q_len, kv_len) bool mask for SDPA."""
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(kv_len, device=device)[None, :]
    return mask_mod(0, 0, q, kv)


def block_mask(mask_mod, q_len, kv_len, device=None):
    """The FlexAttention BlockMask of a mask_mod (shared by every batch row and head)."""
    return create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)
