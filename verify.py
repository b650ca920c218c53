"""Exact verification, shared by the lossless decoders (docs/design.md, sections 4 and 6).

A proposer (SimSD's drafter, Spiffy's graph) turns the open block into Guesses: copies of it
in states it may reach, and after a complete copy, copies of the next block. verify_copies puts
them in ONE forward, each seeing the cache, itself and the copies of the blocks before it
(mask.block_copies), so its logits are the target's in that state. walk applies the rule and,
while the new state is a verified copy, goes on from that copy's logits: plain decoding's
steps and draws, so its output, token for token in fp32 (in bf16 shapes round differently).
"""
from dataclasses import dataclass

import torch

import mask as masks
from decode import Advance, Frontier, packed_rows, to_device, to_host


@dataclass
class Guesses:
    """A round's copies, as verify_copies and walk take them (drawn: docs/design.md, section 6)."""
    copies: torch.Tensor   # (n, B) block states; copies[0] is the open block itself
    n_masked: list         # each copy's number of masked positions (host ints)
    after: list = None     # None: all of the open block; else -1, or the complete copy it follows
    reach: list = None     # the proposer's guess that the walk reaches each copy (fast.sized)
    drafted: list = None   # drafts each copy holds (SimSD's: its drafts accepted)


def verify_copies(sess, g, pos):
    """ONE target forward over the copies of g at the open block's positions `pos` (B,).
    -> (sum(n_masked), V) logits at the masked positions, copy by copy (decode.packed_rows)."""
    n, B = g.copies.shape
    rows = packed_rows(g.copies, sess.model.config.mask_token_id, sum(g.n_masked))
    if n == 1:                                              # one copy: plain decoding's forward
        return sess.forward(g.copies[0], pos, keep=B, rows=rows)
    depth, sees = lineage(g.after or [-1] * n)   # a later block's copy sits B positions on
    positions = (pos + B * to_device(depth, pos.device)[:, None]).flatten()
    sees = to_device(sees, pos.device).bool()
    return sess.forward(g.copies.flatten(), positions, lambda prefix, n_commit: masks.block_copies(
        prefix, n_commit, B, sees), keep=n * B, rows=rows)


def lineage(after, at_least=16):
    """after (Guesses') -> each copy's depth (blocks past the open one), and sees[q][k]: copy
    q sees copy k (itself or a block it continues), at least 16 x 16 (one shape to compile)."""
    n, size = len(after), max(len(after), at_least)
    depth, sees = [0] * n, [[0] * size for _ in range(size)]
    for i in range(n):
        a = i
        while a >= 0:
            sees[i][a], a = 1, after[a]
            depth[i] += a >= 0
    return depth, sees


@dataclass
class Walk:
    """Where plain decoding went through the verified copies."""
    path: list        # the steps, [(the logits stepped from (packed), the new state)]
    host: list        # the last new state (where the round ends), on the host
    ranks: list       # its rows of the walk's `extra` (spiffy.ranks' triple), on the host
    crossed: list     # where it finished a block and went on: [(steps so far, complete copy)]
    copies: list      # Guesses.copies as host lists (the tensor stays in Guesses)
    visited: list     # the copies it reached, in order


no_extra = lambda logits, stepped_from, new: ()   # noqa: E731  walk's default: nothing more


def next_copies(g):
    """Where the walk goes on once a new state is copy c of Guesses g: from c if it has a mask
    left, else from the next block's first copy after c (all masks), else nowhere (None)."""
    n, B = g.copies.shape
    return [c if g.n_masked[c] else next((k for k in range(n) if g.after and g.after[k] == c
                                          and g.n_masked[k] == B), None) for c in range(n)]


def walk(logits, g, step, rule, generator=None, extra=no_extra):
    """Plain decoding through the verified copies of g, from copies[0] at step index `step`,
    on while the new state is a copy of its block to go on from (next_copies). extra(packed
    logits, the (m, B) states stepped from, the (m, B) new states) -> m-row tensors brought
    back (Walk.ranks: the last state's). A host sync a step (walk_one_sync: one a round).
    E.g. B = 4, `_` a mask: copies 0 `a _ _ _` (the open block), 1 `a b _ _`, 2 `a b c _`, 3
    `a b c d` and 4 `_ _ _ _` (the next block, after copy 3); next_copies 0, 1, 2, 4, 4. Copy 0's
    logits step to `a b _ _`: copy 1, on from 1; copy 1's to `a b c d`: copy 3, complete, on from
    4 at step 0; copy 4's to `e _ _ _`: no copy, the round ends. Three steps, one forward."""
    each, n = logits.split(g.n_masked), len(g.n_masked)
    after, then = g.after or [-1] * n, next_copies(g)
    path, crossed, visited, i = [], [], [], 0
    while True:
        new = rule(each[i], g.copies[i], step, generator)
        path.append((each[i], new))
        host, copies, *ranks = to_host(new, g.copies, *extra(each[i], g.copies[i][None], new[None]))
        # the new state as a copy of this block (its copies share `after`) to go on from
        j = next((c for c in range(n) if copies[c] == host and after[c] == after[i]
                  and then[c] is not None), None)
        if j is None:                                    # none: the round ends
            return Walk(path, host, [h[0] for h in ranks], crossed, copies, visited)
        visited.append(j)
        if not g.n_masked[j]:   # block finished: on from the next block's first copy, step 0
            crossed.append((len(path), j))
        i, step = then[j], step + 1 if g.n_masked[j] else 0


def walk_one_sync(logits, g, step, rule, generator=None, extra=no_extra):
    """walk's Walk with ONE host sync a round: the command lines' walk. It differs in how: for a
    greedy_fixed_quota rule every copy is stepped in one call and which copy each new state is, is
    found on the device (another rule: walk itself). Held equal to walk: tests/test_walk.py.
    In walk's example: each copy stepped at once; hit[i, j]: copy i's new state is copy j, of
    its block, to go on from (hit[0, 1], hit[1, 3]); nxt = first_true(hit) comes back in one
    sync and the host follows it: path 0, then[nxt[0]] = 1, then[nxt[1]] = 4; nxt[4] = 5 ends."""
    if len(g.n_masked) == 1:                      # nothing guessed: one step, nothing to compare
        new = rule(logits, g.copies[0], step, generator)
        host, *ranks = to_host(new, *extra(logits, g.copies, new[None]))
        return Walk([(logits, new)], host, [h[0] for h in ranks], [], [None], [])
    if not greedy_fixed_quota(rule):
        return walk(logits, g, step, rule, generator, extra)
    each, copies, then = logits.split(g.n_masked), g.copies, next_copies(g)
    goes_on = [int(c is not None) for c in then]         # verify.walk's test, on the device:
    block_of, goes_on = to_device([g.after or [-1] * len(then), goes_on], copies.device)
    new = rule(logits, copies, step)                                        # (n, B): each stepped
    hit = same_state(copies[None], new[:, None]) & (block_of[None] == block_of[:, None]) & \
        goes_on.bool()      # (n, n): copy i's new state is copy j, of its block, to go on from
    more = extra(logits, copies, new)
    nxt, new_h, all_copies, *ranks = to_host(first_true(hit), new, copies, *more)
    path, crossed, visited = [0], [], []    # copy i's new state is copy nxt[i], if any
    while nxt[path[-1]] < len(copies):
        j = nxt[path[-1]]
        visited.append(j)
        if not g.n_masked[j]:                   # complete: on from the next block's first copy
            crossed.append((len(path), j))
        path.append(then[j])
    last = path[-1]
    return Walk([(each[i], new[i]) for i in path], new_h[last], [h[last] for h in ranks], crossed,
                all_copies, visited)


def greedy_fixed_quota(rule):
    """A step of `rule` depends on nothing but the state and its logits: no random draw, and
    the same quota at every step index. Such a rule can step many states in one call."""
    return rule.temperature == 0 and rule.strategy != "random" and len(set(rule.quota)) == 1


def same_state(copies, state):
    """(n, B) copies and a (B,) state -> (n,) bool: which copies are that state (broadcasts)."""
    return (copies == state).all(-1)


def first_true(flags):
    """Index of the first True along the last dim of a bool tensor; its length if none."""
    return torch.cat([flags, flags.new_ones(*flags.shape[:-1], 1)], -1).int().argmax(-1)


def lossless_round(sess, rule, propose, generator=None, extra=no_extra, walk=walk, counts=None):
    """A round of the lossless decoders (decode.round_loop's one_round): propose(front, left) ->
    Guesses, verified in ONE forward of sess, walked through (`walk`: this module's, or
    walk_one_sync); counts: a counts.Counts the round reports to."""
    def one_round(front, tokens_left):
        g = propose(front, tokens_left)
        w = walk(verify_copies(sess, g, front.pos), g, front.step, rule, generator, extra)
        if counts is not None:
            counts.lossless(g, w)
        done = [(g.copies[j], w.copies[j], j) for _, j in w.crossed]
        step = len(w.path) - w.crossed[-1][0] if w.crossed else front.step + len(w.path)
        pos, n_masked = front.pos + rule.block_size * len(w.crossed), w.host.count(rule.mask_id)
        return Advance(done, Frontier(w.path[-1][1], pos, n_masked, w.host, step, tuple(w.ranks)))
    return one_round
