"""The SimSD paper's own verification and acceptance: NOT lossless (docs/design.md, section 3).

speculate.py holds SimSD's drafter and its default, lossless path; this file holds the paper's
rules, which keep the drafter's choice of positions and their order, and so change the text:
  verify  "temporal": [data section | mask section] under the token-level temporal mask
            (mask.simsd_temporal); the slot of position i sees the block as it was just before
            step tau(i) and copies its RoPE position. 2B queries. Exact for a one-layer target
            only: deeper, a slot also sees slots of later steps, whose hidden states were built
            from data revealed after its step.
          "copies": the drafter's states as whole-block copies (verify.verify_copies): the
            target's exact logits at every drafted state.
  accept  along the draft order: "paper" (accept_temporal, accept_paper): greedy match, or
            min(1, p_target(d) / p_draft(d)); at the first rejection the correction from
            norm(max(0, p_target - p_draft)). "gated" (copies only, accept_gated): only where
            the target is sure of that position in that exact state; where it is not, the
            target's own step, and the round ends.
Measured on the embedded pair (docs/results.md): what loses answers at B = 8 and 32 is the
ORDER the drafter reveals positions in, not the temporal mask's approximation: "copies" with
"paper" loses as many as "temporal"; "gated" keeps the target's answers.
"""
from dataclasses import replace

import torch
import torch.nn.functional as F

import mask as masks
from decode import Advance, Frontier, packed_index, to_device, to_host
from verify import first_true, no_extra, verify_copies

GATE = 0.9   # gated acceptance: the target confidence it accepts at


def verify_temporal(sess, block, pos, d, rule, rope_copy=True):
    """The temporal verifier: ONE target forward over [data section | mask section];
    -> (n_slots, V) logits, the drafted positions' slots first (in d's order), then one per
    undrafted masked position."""
    known = (block != rule.mask_id).nonzero().squeeze(-1)
    undrafted = block == rule.mask_id
    undrafted[d.pos] = False
    undrafted = undrafted.nonzero().squeeze(-1)
    zeros = torch.zeros_like
    data_idx, slot_idx = torch.cat([known, d.pos]), torch.cat([d.pos, undrafted])
    data_tok = block.clone()
    data_tok[d.pos] = d.tokens
    tokens = torch.cat([data_tok[data_idx], torch.full_like(slot_idx, rule.mask_id)])
    last = int(d.tau[-1]) if len(d.tau) else 0
    after_all = torch.full_like(undrafted, last + 1)  # undrafted: masks in every state
    step = torch.cat([zeros(known), d.tau, d.tau, after_all])
    is_slot = torch.cat([zeros(data_idx, dtype=torch.bool),
                         torch.ones_like(slot_idx, dtype=torch.bool)])
    pad = 2 * len(block) - len(step)     # fixed length 2B: one compiled graph for every section
    step, is_slot = F.pad(step, (0, pad)), F.pad(is_slot, (0, pad))
    if rope_copy:
        slot_pos = pos[slot_idx]   # a slot takes the position of its data token
    else:                          # ablation: slots continue the sequence after the block
        slot_pos = pos[-1] + 1 + torch.arange(len(slot_idx), device=pos.device)
    return sess.forward(tokens, torch.cat([pos[data_idx], slot_pos]),
                        lambda c, n: masks.simsd_temporal(c, n, step, is_slot), keep=len(slot_idx))


def slots_by_position(block, d, rule):
    """The temporal verifier's slots (verify_temporal's order), reordered by position."""
    undrafted = block == rule.mask_id
    undrafted[d.pos] = False
    return torch.cat([d.pos, undrafted.nonzero().squeeze(-1)]).argsort()


def agree(p_target, d, rule, generator=None):
    """(n,) bool: the target accepts each draft; greedy: its argmax is d; sampling:
    u < p_target(d) / p_draft(d) (speculative sampling, one uniform draw per draft)."""
    n = torch.arange(len(d.pos), device=d.pos.device)
    if rule.temperature == 0:
        return p_target.argmax(-1) == d.tokens
    u = torch.rand(len(n), generator=generator, device=p_target.device)
    return u * d.p_draft[n, d.tokens] < p_target[n, d.tokens]


def correct(p_target, p_draft, rule, generator=None):
    """The token at the first rejected draft, from norm(max(0, p_target - p_draft)) (from
    p_target itself when greedy, or when that is all zero)."""
    if rule.temperature == 0:
        return p_target.argmax()
    residual = (p_target - p_draft).clamp(min=0)
    residual = torch.where(residual.sum() > 0, residual, p_target)      # (no host sync)
    return draw(residual / residual.sum(), generator)


def draw(p, generator=None):
    """A token from each row of p (..., V), as torch.multinomial(p, 1) draws it (the same
    Exp(1) race, so the same tokens), without its host syncs."""
    return (p / torch.empty_like(p).exponential_(generator=generator)).argmax(-1)


def accept_temporal(logits, block, d, rule, generator=None):
    """The paper's rule on the temporal verifier's slots, along tau; -> (new block, accepted)."""
    n = len(d.pos)
    p_target = rule.probs(logits)                                    # (n_slots, V)
    accepted = int(agree(p_target[:n], d, rule, generator).int().cumprod(0).sum())  # host sync
    block = block.clone()
    block[d.pos[:accepted]] = d.tokens[:accepted]
    if accepted < n:
        block[d.pos[accepted]] = correct(p_target[accepted], d.p_draft[accepted], rule, generator)
    elif len(logits) > n:  # all accepted, masks remain: bonus from the undrafted slots
        tok, confidence = rule.pick(logits[n:], generator)
        best = confidence.sort(descending=True, stable=True).indices[0]
        block[(block == rule.mask_id).nonzero().squeeze(-1)[best]] = tok[best]
    return block, accepted


def drafts_agreed(logits, copies, d, src, rule, generator=None):
    """The target at each draft, in the state it was drafted in (draft k: copies[src[k]]), from
    verify_copies' packed logits. -> ((n, V) p_target there, (n,) bool: it agrees (agree))."""
    at = packed_index(copies, rule.mask_id)                          # (m, B): each one's row
    p_target = rule.probs(logits[at[to_device(src, copies.device), d.pos % copies.shape[1]]])
    return p_target, agree(p_target, d, rule, generator)


def target_sure(logits, copies, d, src, rule, gate):
    """(n,) bool: the target is sure of draft k's position in the state it was drafted in: it
    is the target's most confident masked position there, or its confidence is above gate."""
    k, B = torch.arange(len(d.pos), device=d.pos.device), copies.shape[1]
    top = rule.top_confidence(logits)[packed_index(copies, rule.mask_id)]    # (m, B)
    top = top.masked_fill(copies != rule.mask_id, -1.0)           # a known position: never top
    top = top[to_device(src, copies.device)]
    return (top.argmax(-1) == d.pos % B) | (top[k, d.pos % B] > gate)


def ended_in(parent, c, step):
    """A round that ends in copy c (parent: Draft.layout's): the complete copies of the blocks it
    went past (lookahead), the drafts it took in c's own block, and the target's step index at c."""
    crossed, a = [], c
    while parent is not None and parent[a] >= 0:
        a = parent[a]
        crossed.insert(0, a)
    taken = c - (parent[c] + 1 if parent else 0)
    return crossed, taken, taken + (0 if crossed else step)


def corrected(copies, d, p_target, k, c, rule, generator=None):
    """copies[c] (drafts before k accepted) with draft k's position given the target's
    correction (correct) instead of the rejected draft."""
    block = copies[c].clone()
    block[d.pos[k] % len(block)] = correct(p_target[k], d.p_draft[k], rule, generator)
    return block


def target_step(logits, copies, counts, c, step, rule, generator=None):
    """The target's own decoding step from copies[c] (its logits came with the forward) at step
    index `step`, or none when copies[c] is full. -> (new block, whether it stepped)."""
    if not counts[c]:                                                # full: no step
        return copies[c], 0
    return rule(logits.split(counts)[c], copies[c], step, generator), 1


def accept_paper(logits, copies, counts, d, step, rule, generator=None):
    """The paper's rule on exact logits: accept the drafts in draft order while the target
    agrees with each in the state it was drafted in (greedy: the draft is its argmax there;
    sampling: speculative sampling's u < p_target(d) / p_draft(d)). The first rejected draft
    is replaced by the target's correction, from norm(max(0, p_target - p_draft)), so each
    committed token follows p_target at its position and state (speculative sampling's
    guarantee); if every draft is accepted, the target steps from the last state (a bonus).
    Not lossless: the drafter chose which positions to reveal, and in which order.
    -> (new block, drafts accepted, target steps taken in the new block's block, why the round
    ended, the complete copies of the blocks it finished on the way (lookahead))."""
    _, parent, src = d.layout(counts[0], copies.shape[1])
    p_target, agreed = drafts_agreed(logits, copies, d, src, rule, generator)
    accepted = int(first_true(~agreed))                              # host sync
    c = src[accepted] if accepted < len(src) else len(copies) - 1
    crossed, taken, at_step = ended_in(parent, c, step)
    if accepted < len(src):
        block = corrected(copies, d, p_target, accepted, c, rule, generator)
        return block, accepted, taken + 1, "draft rejected", crossed
    block, stepped = target_step(logits, copies, counts, c, at_step, rule, generator)
    return block, accepted, taken + stepped, "every draft accepted", crossed


def accept_gated(logits, copies, counts, d, step, rule, generator=None, gate=GATE):
    """The paper's rule, gated by the target's confidence: accept a draft only where the target
    is sure of its position in that exact state (target_sure) and agrees with it. Where it is
    sure and disagrees, its correction, as in accept_paper; where it is unsure, it does not
    follow the drafter's choice of position: it takes its own decoding step (static or
    threshold) from that state, and the round ends. Why: what loses answers at large B is the
    ORDER the drafter reveals positions in, and the gate keeps the target's own order wherever
    it is not sure of the drafter's. -> as accept_paper."""
    _, parent, src = d.layout(counts[0], copies.shape[1])
    p_target, agreed = drafts_agreed(logits, copies, d, src, rule, generator)
    sure = target_sure(logits, copies, d, src, rule, gate)
    accepted = int(first_true(~(agreed & sure)))                     # host sync
    c = src[accepted] if accepted < len(src) else len(copies) - 1
    crossed, taken, at_step = ended_in(parent, c, step)
    if accepted < len(src) and bool(sure[accepted]):                 # host sync: sure, disagrees
        block = corrected(copies, d, p_target, accepted, c, rule, generator)
        return block, accepted, taken + 1, "target sure, draft rejected", crossed
    block, stepped = target_step(logits, copies, counts, c, at_step, rule, generator)
    why = "every draft accepted" if accepted == len(src) else "target unsure"
    return block, accepted, taken + stepped, why, crossed


def temporal_round(tsess, drafts, rule, order="tau", rope_copy=True, generator=None,
                   extra=no_extra):
    """A round of the paper's own path (decode.round_loop's round_): drafts(front, room) -> a Draft
    of the open block; ONE target forward over [data section | mask section]
    (verify_temporal); the paper's rule along the step map (accept_temporal).
    order="position", rope_copy=False: the paper's ablations. extra: as verify.walk's, on the
    slots' logits in position order (each masked position's, in the state its slot saw), for
    the new state's hint. -> (Advance, drafts accepted, None: the round's end has no name here)."""
    def round_(front, room):
        d = drafts(front, room)
        if order == "position":                                      # ablation: left to right
            by = d.pos.argsort()
            d = replace(d, pos=d.pos[by], tokens=d.tokens[by], p_draft=d.p_draft[by],
                        tau=torch.arange(1, len(d.pos) + 1, device=d.pos.device))
        logits = verify_temporal(tsess, front.block, front.pos, d, rule, rope_copy)
        block, accepted = accept_temporal(logits, front.block, d, rule, generator)
        more = () if extra is no_extra else extra(logits[slots_by_position(front.block, d, rule)],
                                                  front.block[None], block[None])
        host, *hint = to_host(block, *more)
        front = Frontier(block, front.pos, host.count(rule.mask_id), host, front.step + 1,
                         tuple(h[0] for h in hint))
        return Advance([], front), accepted, None
    return round_


def copies_round(tsess, drafts, rule, accept, generator=None):
    """A round of the paper's rules on exact logits: drafts(front, room) -> a Draft (across
    blocks, with lookahead); ONE target forward over its states as block copies; `accept`
    (accept_paper or accept_gated) keeps what it keeps. -> (Advance, drafts accepted, why).
    These rules read the state before each draft, so every drafted state is verified, also where
    a cost table kept only some (Draft.keep: the lossless walk's)."""
    def round_(front, room):
        d = replace(drafts(front, room), keep=None)
        g = d.guesses(front.block, front.n_masked)
        logits = verify_copies(tsess, g, front.pos)
        block, accepted, steps, why, crossed = accept(logits, g.copies, g.counts, d, front.step,
                                                      rule, generator)
        copies, host = to_host(g.copies, block)
        done = [(g.copies[j], copies[j], j) for j in crossed]
        pos = front.pos + rule.block_size * len(crossed)
        step = steps if crossed else front.step + steps
        front = Frontier(block, pos, host.count(rule.mask_id), host, step)
        return Advance(done, front), accepted, why
    return round_
