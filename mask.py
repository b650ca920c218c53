"""Every attention rule of the project, as FlexAttention `mask_mod` closures.

A mask_mod is a function (b, h, q_idx, kv_idx) -> bool tensor, True where the query may
attend to the key (FlexAttention's convention). The same closure drives both attention paths:
`flex_attention` through `create_block_mask`, and SDPA through `dense_mask`, which evaluates
it on broadcast aranges. One source of truth, and a free dense reference for the tests. `python draw_masks.py` draws
them all.

Closures capture tensors, never Python ints that change from call to call: a captured int is a
constant to torch.compile, so every new value would recompile (0-d tensors do not).

Index convention for the cached forwards (model.py): the keys are [cache ; queries], so the
query q_idx sits at key index `prefix + q_idx`, where `prefix` is the committed cache length.

References: SDAR for block-causal decoding, SimSD (temporal mask, docs/design.md section 3),
Spiffy (draft-graph copies, section 4). Training's BD3-LM mask is objective.py's; static
shapes' padded mask fast.py's.
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


def dense_mask(mask_mod, q_len, kv_len, device=None):
    """Evaluate a mask_mod on broadcast aranges: a (q_len, kv_len) bool mask for SDPA."""
    q = torch.arange(q_len, device=device)[:, None]
    kv = torch.arange(kv_len, device=device)[None, :]
    return mask_mod(0, 0, q, kv)


def block_mask(mask_mod, q_len, kv_len, device=None):
    """The FlexAttention BlockMask of a mask_mod (shared by every batch row and head)."""
    return create_block_mask(mask_mod, None, None, q_len, kv_len, device=device)
