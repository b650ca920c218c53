"""Exact verification shared by the lossless decoders: ONE target forward over whole-block copies
of guessed states, then plain decoding's rule walked through them.

- A proposer (SimSD's drafter, Spiffy's graph, or nothing: plain decoding) turns the frontier
  into `Guesses`: copies of the open block in states it may reach, and, after a complete copy,
  copies of the next block, which sees that copy as its earlier block.
- verify_copies: the query is [X_t ; s_1 ; ... ; s_n], each copy a full block at its block's
  positions, attending to the cache, to itself and to the copies of the blocks before it
  (mask.block_copies). Attention is block-causal, so each copy's logits are exactly the
  target's in that state, at any depth. The logits are packed: the head runs at the copies'
  masked positions only, all that the rule reads.
- walk: apply the decoding rule to X_t's logits; while the new state is one of the verified
  copies, continue from that copy's logits; a complete one leads on into its next block.
  Every transition is plain decoding's, on exact logits, with the random draws in plain
  decoding's order: the output is plain decoding's.
- lossless_round: propose -> verify -> walk, one round of the loop in decode.py.
"Lossless" is exact in exact arithmetic and token for token in fp32 (tested). In bf16 a
copy's logits come from a forward of another shape than plain decoding's, which rounds
differently, so a near-tie can go the other way: bench.py reports the agreement rate there.
"""
from dataclasses import dataclass

import torch

import mask as masks
from decode import Advance, Frontier, packed_rows, to_device, to_host


@dataclass
class Guesses:
    """A round's copies, as verify_copies and walk take them."""
    copies: torch.Tensor   # (n, B) block states; copies[0] is the open block itself
    counts: list           # each copy's number of masked positions (host ints)
    parent: list = None    # None: every copy is a state of the open block; else parent[i] = -1
                           # for those, or the index of the COMPLETE copy of the block before
                           # the block copy i is a state of (always an earlier copy)
    reach: list = None     # the proposer's guess that the walk reaches each copy (fast.sized)
    drafted: list = None   # drafts each copy holds (SimSD's: its drafts accepted)

    def prefix(self, n):
        """The first n copies (a copy's parent comes before it: still a whole)."""
        cut = lambda x: x if x is None else x[:n]   # noqa: E731
        return Guesses(self.copies[:n], self.counts[:n], cut(self.parent), cut(self.reach),
                       cut(self.drafted))


def propose_nothing(front, room):
    """Plain decoding as a proposer: the open block's own state, no guess."""
    return Guesses(front.block[None], [front.n_masked])


def verify_copies(sess, g, pos):
    """ONE target forward over the copies of g (Guesses) at the open block's positions `pos`
    (B,). -> (sum(counts), V) logits at the masked positions only, copy by copy, in order
    (packed: decode.packed_rows)."""
    n, B = g.copies.shape
    positions, sees = pos.repeat(n), None
    if g.parent is not None:        # a copy of a later block sits B positions on per block
        depth, sees = lineage(g.parent)
        positions = (pos + B * to_device(depth, pos.device)[:, None]).flatten()
        sees = to_device(sees, pos.device).bool()
    rows = packed_rows(g.copies, sess.model.config.mask_token_id, sum(g.counts))
    mask = (lambda c, k: masks.block_causal(B, c)) if n == 1 else \
        (lambda c, k: masks.block_copies(c, k, B, sees))      # (one copy: plain decoding's mask)
    return sess.forward(g.copies.flatten(), positions, mask, keep=n * B, rows=rows)


def lineage(parent, at_least=16):
    """parent (Guesses') -> each copy's depth (blocks past the open one), and sees[q][k]: copy
    q sees copy k, itself or a block it continues; padded to at_least x at_least, so that the
    mask's captured tensor keeps one shape (no recompiles)."""
    n = len(parent)
    size = max(n, at_least)
    depth, sees = [0] * n, [[0] * size for _ in range(size)]
    for i in range(n):
        a = i
        while a >= 0:
            sees[i][a], a = 1, parent[a]
            depth[i] += a >= 0
    return depth, sees


@dataclass
class Walk:
    """Where plain decoding went through the verified copies."""
    path: list        # the transitions, [(logits stepped from (that copy's, packed), new state)]
    host: list        # the last new state (where the round ends), on the host
    hint: list        # its rows of the walk's `extra`, on the host
    crossed: list     # where it finished a block and went on:
                      # [(transitions so far, the complete copy)]
    copies: list      # every copy, on the host
    visited: list     # the copies it reached, in order


def no_extra(logits, copies, states):
    """walk's default `extra`: nothing besides the new state."""
    return ()


def walk(logits, g, step, rule, generator=None, extra=no_extra):
    """Plain decoding through the verified copies of g, from copies[0] at the rule's step index
    `step`: a new state with a mask left goes on from the copy of the same block in that
    state, a complete one from the next block's first copy after it (step index back at 0).
    The random draws come in plain decoding's order. extra(packed logits of (m, B) copies, the
    (m, B) states they step to) -> tensors of m rows, brought to the host with the walk
    (Walk.hint: the last state's rows). A host sync a step (fast.walk: one a round)."""
    each, n = logits.split(g.counts), len(g.counts)
    parent = g.parent or [-1] * n
    first = {}                            # a complete copy -> its next block's first copy
    for c in range(n):
        if parent[c] >= 0 and g.counts[c] == len(g.copies[c]):
            first.setdefault(parent[c], c)
    path, crossed, visited, i = [], [], [], 0
    while True:
        new = rule(each[i], g.copies[i], step, generator)
        path.append((each[i], new))
        host, copies, *hint = to_host(new, g.copies, *extra(each[i], g.copies[i][None], new[None]))
        same = [c for c in range(n) if copies[c] == host and parent[c] == parent[i]
                and (g.counts[c] or c in first)]        # a copy to go on from
        if not same:                                     # none: the round ends
            return Walk(path, host, [h[0] for h in hint], crossed, copies, visited)
        visited.append(same[0])
        if g.counts[same[0]]:
            i, step = same[0], step + 1
        else:                                            # block finished: on into the next
            crossed.append((len(path), same[0]))
            i, step = first[same[0]], 0


def lossless_round(sess, rule, propose, generator=None, extra=no_extra, walk=walk, stats=None):
    """A round of the lossless decoders (decode.round_loop's round_): propose(front, room) ->
    Guesses; ONE forward of sess verifies them; the target's own rule walks through them
    (`walk`: this module's, or fast.walk). stats: a Counter the round counts itself into
    (tally). -> decode.Advance."""
    def round_(front, room):
        g = propose(front, room)
        w = walk(verify_copies(sess, g, front.pos), g, front.step, rule, generator, extra)
        if stats is not None:
            tally(stats, g, w)
        done = [(g.copies[j], w.copies[j], j) for _, j in w.crossed]
        step = len(w.path) - w.crossed[-1][0] if w.crossed else front.step + len(w.path)
        pos = front.pos + rule.block_size * len(w.crossed)
        n_masked = w.host.count(rule.mask_id)
        return Advance(done, Frontier(w.path[-1][1], pos, n_masked, w.host, step, tuple(w.hint)))
    return round_


def tally(stats, g, w):
    """A round's counts: steps walked, copies verified, blocks finished ahead; with g.drafted,
    drafts accepted (the most any state the walk reached holds) and why the round ended."""
    stats["steps", len(w.path)] += 1
    stats["copies", len(g.counts) - 1] += 1
    stats["blocks_ahead"] += len(w.crossed)
    if g.drafted and max(g.drafted):
        depth = lineage(g.parent)[0] if g.parent else [0] * len(g.counts)
        ended = [c for c, s in enumerate(w.copies) if s == w.host and depth[c] == len(w.crossed)]
        k = max(g.drafted[c] for c in [0, *w.visited, *ended])
        stats["accepted", k] += 1
        why = "every draft accepted" if k == max(g.drafted) else "target chose otherwise"
        stats["end", why] += 1
    elif g.drafted is not None:
        stats["accepted", 0] += 1
        stats["end", "nothing drafted"] += 1


def counted(stats, kind):
    """{n: rounds} of the Counter's (kind, n) entries."""
    return dict(sorted((k[1], v) for k, v in stats.items() if type(k) is tuple and k[0] == kind))


def first_true(flags):
    """Index of the first True along the last dim of a bool tensor; its length if none."""
    return torch.cat([flags, flags.new_ones(*flags.shape[:-1], 1)], -1).int().argmax(-1)
