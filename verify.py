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
import bisect
import itertools
import time
import weakref

import torch

import mask as masks
from decode import Session, packed_rows, to_device, to_host


def verify_copies(sess, copies, pos, counts, mask_id, parent=None):
    """copies: (n, B) block states, copies[0] the current block; pos: (B,) its positions;
    counts: each copy's number of masked positions (host ints); parent: None when every copy
    is a state of the current block, else (host ints) parent[i] = -1 for such a copy, or the
    index of the COMPLETE copy of the block before whose next block copy i is a state of.
    -> (sum(counts), V) logits at the masked positions only, copy by copy, in order (packed:
    decode.packed_rows)."""
    n, B = copies.shape
    positions, sees = pos.repeat(n), None
    if parent is not None:          # a copy of a later block sits B positions on per block
        depth, sees = tree(parent)
        positions = (pos + B * to_device(depth, pos.device)[:, None]).flatten()
        sees = to_device(sees, pos.device).bool()
    return sess.forward(copies.flatten(), positions, lambda c, k: masks.block_copies(c, k, B, sees),
                        keep=n * B, rows=packed_rows(copies, mask_id, sum(counts)))


COSTS = weakref.WeakKeyDictionary()   # model -> {B: its forward_cost}


def forward_cost(model, B):
    """cost(n) -> the seconds a verification forward of n whole-block copies takes on this model
    and its device, measured once per block size (measure_cost): what the copies of a round
    are sized by (cost-sized copies: spiffy.draft_copies, speculate.Draft.sized)."""
    costs = COSTS.setdefault(model, {})
    if B not in costs:
        costs[B] = measure_cost(model, B)
    return costs[B]


def measure_cost(model, B, repeats=5):
    """forward_cost's measurement: forwards of n = 1, 2, 4, 8, 16 all-mask copies after two
    blocks of cache, the fastest of `repeats` each, taken in turns (1, 2, ..., 16, 1, 2, ...)
    so that a slow spell of the machine spreads over every n; linear between and past."""
    device, mask_id = model.embed.weight.device, model.config.mask_token_id
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sess = Session(model, B, 19 * B)
    sess.prefill(torch.zeros(2 * B, dtype=torch.long, device=device))
    pos, ns = torch.arange(2 * B, 3 * B, device=device), (1, 2, 4, 8, 16)
    times = {n: [] for n in ns}
    for _ in range(repeats + 1):                                      # the first: a warm-up
        for n in ns:
            sync()
            t0 = time.perf_counter()
            verify_copies(sess, torch.full((n, B), mask_id, device=device), pos, [B] * n, mask_id)
            sync()
            times[n].append(time.perf_counter() - t0)
    ts = list(itertools.accumulate((min(times[n][1:]) for n in ns), max))   # more copies never cheaper

    def cost(n):
        i = min(max(bisect.bisect_left(ns, n), 1), len(ns) - 1)      # the segment n is on (or past)
        return ts[i - 1] + (ts[i] - ts[i - 1]) * (n - ns[i - 1]) / (ns[i] - ns[i - 1])
    return cost


def tree(parent, at_least=16):
    """parent (see verify_copies) -> each copy's depth (blocks past the current one), and
    sees[q][k]: copy q sees copy k, itself or a block it continues; padded to at_least x
    at_least, so that the mask's captured tensor keeps one shape (no recompiles)."""
    n = len(parent)
    size = max(n, at_least)
    depth, sees = [0] * n, [[0] * size for _ in range(size)]
    for i in range(n):
        a = i
        while a >= 0:
            sees[i][a], a = 1, parent[a]
            depth[i] += a >= 0
    return depth, sees


def groups(parent, counts, copies):
    """Which states the walk may go on to, as device tensors: (n,) the block each copy is a
    state of (its parent), and (n,) whether it has a mask left or a next block to go on to;
    and, on the host, the next block's first copy (all masks) of each complete copy that has one."""
    n, B = copies.shape
    parent = [-1] * n if parent is None else parent
    child = {}
    for i, p in enumerate(parent):
        if p >= 0 and counts[i] == B:
            child.setdefault(p, i)
    go_on = [int(counts[i] > 0 or i in child) for i in range(n)]
    group, go_on = to_device([parent, go_on], copies.device)
    return group, go_on.bool(), child


def no_extra(logits, copies, states):
    """walk's default `extra`: nothing besides the new state."""
    return ()


def walk(logits, copies, counts, step, rule, generator=None, extra=no_extra, parent=None):
    """Plain decoding through verified states. logits, counts, parent: verify_copies' (logits
    packed); step: the rule's step index at copies[0]. -> (path, host, crossed): the
    transitions taken, [(logits stepped from (that copy's, packed), new state)], at least
    one, the last new state where the round ends; as lists, that state and its rows of
    extra(logits, copies, new states) (extra: the packed logits of (m, B) copies and the (m,
    B) states they step to -> tensors of m rows); and where the walk finished a block and
    went on into the next: [(transitions so far, the complete copy)].
    A new state with a mask left goes on from the copy of the same block in that state; a
    complete one, from the next block's first copy after it (parent), the step index back at 0.
    Two ways to the same result (tests/test_walk.py): walk_stepwise, plain decoding's own
    loop, a host sync a step, for any rule; and for a stateless rule (DecodeRule.stateless)
    walk_batched, which steps every copy at once: ONE host sync."""
    if rule.stateless:
        return walk_batched(logits, copies, counts, step, rule, extra, parent)
    return walk_stepwise(logits, copies, counts, step, rule, generator, extra, parent)


def walk_stepwise(logits, copies, counts, step, rule, generator=None, extra=no_extra, parent=None):
    """The walk as plain decoding takes it, one step at a time (the reference, for any rule:
    the random draws come in plain decoding's order). Step the current copy on its logits; if
    the new state is a verified copy the walk can go on from, go on, else the round ends at
    the new state. A host sync a step."""
    each = logits.split(counts)                                             # copy i's: (counts[i], V)
    group, go_on, child = groups(parent, counts, copies)
    path, crossed, i = [], [], 0
    while True:
        new = rule(each[i], copies[i], step, generator)
        path.append((each[i], new))
        hit = same_state(copies, new) & (group == group[i]) & go_on          # (n,): go on from?
        j, *host = to_host(first_true(hit), new[None], *extra(each[i], copies[i][None], new[None]))
        if j == len(copies):                                # (host sync above) none: the round ends
            return path, [h[0] for h in host], crossed
        if counts[j]:
            i, step = j, step + 1
        else:                                               # block finished: on into the next
            crossed.append((len(path), j))
            i, step = child[j], 0


def walk_batched(logits, copies, counts, step, rule, extra=no_extra, parent=None):
    """walk_stepwise's result for a stateless rule, with ONE host sync. Such a step depends on
    its state and logits only (no draw, the same quota at every step index), so the rule can
    step EVERY copy in one batched call, whether the walk reaches it or not; which copy each
    new state is, is found on the device too, and only the chain is followed on the host."""
    each = logits.split(counts)                                             # copy i's: (counts[i], V)
    group, go_on, child = groups(parent, counts, copies)
    new = rule(logits, copies, step)                                        # (n, B): each stepped
    hit = same_state(copies[None], new[:, None]) & (group[None] == group[:, None]) & go_on
    nxt, new_h, *extra_h = to_host(first_true(hit), new, *extra(logits, copies, new))   # host sync
    path, crossed = [0], []                 # copy i's next state is copy nxt[i], if any
    while nxt[path[-1]] < len(copies):
        j = nxt[path[-1]]
        if not counts[j]:
            crossed.append((len(path), j))
            j = child[j]
        path.append(j)
    last = path[-1]
    return [(each[i], new[i]) for i in path], [new_h[last]] + [e[last] for e in extra_h], crossed


def first_true(flags):
    """Index of the first True along the last dim of a bool tensor; its length if none."""
    return torch.cat([flags, flags.new_ones(*flags.shape[:-1], 1)], -1).int().argmax(-1)


def same_state(copies, state):
    """(n, B) copies and a (B,) state -> (n,) bool: which copies are that state (broadcasts)."""
    return (copies == state).all(-1)
