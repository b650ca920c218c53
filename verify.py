"""Exact verification shared by the speculative decoders: ONE target forward over whole-block
copies of guessed states, then plain decoding's rule walked through them.

- verify_copies: the query is [X_t ; s_1 ; ... ; s_n], each copy a full block at the block's
  own positions, attending to the cache and to itself only (mask.block_copies). Attention is
  block-causal, so a block never sees anything after it: each copy's logits are exactly the
  target's in that state, at any depth.
- The logits are packed: the head runs at the copies' masked positions only, all that the rule
  reads (with a large vocabulary the head is most of a small model's forward).
- walk: apply the decoding rule to X_t's logits; while the new state is one of the verified
  copies, continue from that copy's logits. Every transition is plain decoding's, on exact
  logits, with the random draws in plain decoding's order: the output is plain decoding's.
  walk_stepwise is that loop as it reads (a host sync a step); walk_batched, the fast path
  for a stateless rule, steps every copy in one call and takes the same path (one sync).
"Lossless" is exact in exact arithmetic and token for token in fp32 (tested). In bf16 a
copy's logits come from a forward of another shape than plain decoding's, which rounds
differently, so a near-tie can go the other way: bench.py reports the agreement rate there.
Spiffy's copies come from its draft graph (spiffy.py), SimSD's from the drafter (speculate.py).
"""
import torch

import mask as masks
from decode import packed_rows, to_host


def verify_copies(sess, copies, pos, counts, mask_id):
    """copies: (n, B) block states, copies[0] the current block; pos: (B,) its positions;
    counts: each copy's number of masked positions (host ints). -> (sum(counts), V) logits
    at the masked positions only, copy by copy, in order (packed: decode.packed_rows)."""
    n, B = copies.shape
    return sess.forward(copies.flatten(), pos.repeat(n), lambda c, k: masks.block_copies(c, k, B),
                        keep=n * B, rows=packed_rows(copies, mask_id, sum(counts)))


def no_extra(logits, copies, states):
    """walk's default `extra`: nothing besides the new state."""
    return ()


def walk(logits, copies, counts, step, rule, generator=None, extra=no_extra):
    """Plain decoding through verified states. logits, counts: verify_copies' (packed); step:
    the rule's step index at copies[0]. -> (path, host): the transitions taken, [(logits
    stepped from (that copy's, packed), new state)], at least one, the last new state where
    the round ends; and, as lists, that state and its rows of extra(logits, copies, new
    states) (extra: the packed logits of (m, B) copies and the (m, B) states they step to ->
    tensors of m rows).
    Two ways to the same result (tests/test_walk.py): walk_stepwise, plain decoding's own
    loop, a host sync a step, for any rule; and for a stateless rule (DecodeRule.stateless)
    walk_batched, which steps every copy at once: ONE host sync."""
    if rule.stateless:
        return walk_batched(logits, copies, counts, step, rule, extra)
    return walk_stepwise(logits, copies, counts, step, rule, generator, extra)


def walk_stepwise(logits, copies, counts, step, rule, generator=None, extra=no_extra):
    """The walk as plain decoding takes it, one step at a time (the reference, for any rule:
    the random draws come in plain decoding's order). Step the current copy on its logits; if
    the new state is a verified copy with a mask left, go on from that copy (its logits are
    already here), else the round ends at the new state. A host sync a step."""
    each = logits.split(counts)                                             # copy i's: (counts[i], V)
    path, i = [], 0
    while True:
        new = rule(each[i], copies[i], step + len(path), generator)
        path.append((each[i], new))
        hit = same_state(copies[1:], new) & (new == rule.mask_id).any()    # (n - 1,): go on from?
        j, *host = to_host(first_true(hit), new[None], *extra(each[i], copies[i][None], new[None]))
        if j == len(hit):                                   # (host sync above) none: the round ends
            return path, [h[0] for h in host]
        i = j + 1                                           # go on from copy j + 1 (copies[1:][j])


def walk_batched(logits, copies, counts, step, rule, extra=no_extra):
    """walk_stepwise's result for a stateless rule, with ONE host sync. Such a step depends on
    its state and logits only (no draw, the same quota at every step index), so the rule can
    step EVERY copy in one batched call, whether the walk reaches it or not; which copy each
    new state is, is found on the device too, and only the chain is followed on the host."""
    each = logits.split(counts)                                             # copy i's: (counts[i], V)
    new = rule(logits, copies, step)                                        # (n, B): each stepped
    hit = same_state(copies[None, 1:], new[:, None]) & (new == rule.mask_id).any(-1, keepdim=True)
    nxt, new_h, *extra_h = to_host(first_true(hit), new, *extra(logits, copies, new))   # host sync
    path = [0]                              # copy i's next state is copy nxt[i] + 1, if any
    while nxt[path[-1]] < len(copies) - 1:
        path.append(nxt[path[-1]] + 1)
    last = path[-1]
    return [(each[i], new[i]) for i in path], [new_h[last]] + [e[last] for e in extra_h]


def first_true(flags):
    """Index of the first True along the last dim of a bool tensor; its length if none."""
    return torch.cat([flags, flags.new_ones(*flags.shape[:-1], 1)], -1).int().argmax(-1)


def same_state(copies, state):
    """(n, B) copies and a (B,) state -> (n,) bool: which copies are that state (broadcasts)."""
    return (copies == state).all(-1)
