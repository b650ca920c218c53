"""Exact verification shared by the speculative decoders: ONE target forward over whole-block
copies of guessed states, then plain decoding's rule walked through them.

- verify_copies: the query is [X_t ; s_1 ; ... ; s_n], each copy a full block at the block's
  own positions, attending to the cache and to itself only (mask.spiffy_copies). Attention is
  block-causal, so a block never sees anything after it: each copy's logits are exactly the
  target's in that state, at any depth.
- walk: apply the decoding rule to X_t's logits; while the new state is one of the verified
  copies, continue from that copy's logits. Every transition is plain decoding's, on exact
  logits, with the random draws in plain decoding's order: the output is plain decoding's.
"Lossless" is exact in exact arithmetic and token for token in fp32 (tested). In bf16 a
copy's logits come from a forward of another shape than plain decoding's, which rounds
differently, so a near-tie can go the other way: bench.py reports the agreement rate there.
Spiffy's copies come from its draft graph (spiffy.py), SimSD's from the drafter (speculate.py).
"""
import torch

import mask as masks
from decode import to_host


def verify_copies(sess, copies, pos):
    """copies: (n, B) block states, copies[0] the current block; pos: (B,) its positions.
    -> (n, B, V) logits, copy by copy."""
    n, B = copies.shape
    logits = sess.forward(copies.flatten(), pos.repeat(n),
                          lambda c, k: masks.spiffy_copies(c, k, B), keep=n * B)
    return logits.view(n, B, -1)


def walk(logits, copies, step, rule, generator=None, extra=lambda logits, states: ()):
    """Plain decoding through verified states. logits: (n, B, V) from verify_copies; step: the
    rule's step index at copies[0]. -> (path, host): the transitions taken, [(logits stepped
    from, new state)], at least one, the last new state where the round ends; and, as lists,
    that state and extra(its logits, it) (extra: (m, B, V), (m, B) -> tensors of m rows).
    A stateless rule steps every copy in one batched call and the path is found on the host:
    ONE host sync. Any other rule draws in plain decoding's order, one step at a time: a
    host sync a step."""
    if rule.stateless:
        new = rule(logits, copies, step)                                    # (n, B)
        hit = same_state(copies[None, 1:], new[:, None]) & (new == rule.mask_id).any(-1, keepdim=True)
        nxt, new_h, *extra_h = to_host(first_true(hit), new, *extra(logits, new))   # host sync
        path = [0]                              # copy i's next state is copy nxt[i] + 1, if any
        while nxt[path[-1]] < len(copies) - 1:
            path.append(nxt[path[-1]] + 1)
        last = path[-1]
        return [(logits[i], new[i]) for i in path], [new_h[last]] + [e[last] for e in extra_h]
    path, i = [], 0
    while True:
        new = rule(logits[i], copies[i], step + len(path), generator)
        path.append((logits[i], new))
        hit = same_state(copies[1:], new) & (new == rule.mask_id).any()    # (n - 1,)
        j, *host = to_host(first_true(hit), new[None], *extra(logits[i][None], new[None]))  # sync
        if j == len(hit):
            return path, [h[0] for h in host]
        i = j + 1


def first_true(flags):
    """Index of the first True along the last dim of a bool tensor; its length if none."""
    return torch.cat([flags, flags.new_ones(*flags.shape[:-1], 1)], -1).int().argmax(-1)


def same_state(copies, state):
    """(n, B) copies and a (B,) state -> (n,) bool: which copies are that state (broadcasts)."""
    return (copies == state).all(-1)
