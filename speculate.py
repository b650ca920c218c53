"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

docs/design.md, section 3 (after the SimSD paper). Each round of the loop (decode.round_loop):
  draft   the drafter decodes the open block, and up to `lookahead` blocks past it, for a
          fixed number of its own steps, every decision on the device (draft). Each drafted
          token d_i keeps its step label tau(i) and its draft distribution p_draft(i).
  verify  lossless (the default): the drafter's states (after each draft, or each step of a
          several-token rule) as block copies in ONE target forward, the target's own rule
          walked through them (verify.py): plain decoding's output, token for token in fp32.
          temporal (the paper's): ONE forward over [data section | mask section] under the
          token-level temporal mask, slots at their tokens' RoPE positions (verify_temporal),
          the drafts accepted along tau (accept_temporal): greedy or sampled; not lossless.
variants.py: the drafter-free references and the ablations; fast.py: the speed devices.

    python sample.py --spec simsd                  # on the embedded models
"""
from itertools import accumulate
from dataclasses import dataclass

import torch

import mask as masks
from decode import (Advance, DecodeRule, Frontier, Session, check_prompt, round_loop, stop_ids,
                    to_device, to_host)
from verify import Guesses, lossless_round, no_extra, verify_copies, walk

DRAFT_THRESHOLD, DRAFT_STOP = 0.5, 0.3   # measured on the embedded pair (docs/results.md)
DRAFT_STEPS, LOOKAHEAD = {4: 3}, 3   # drafter forwards a round by B (else 1); blocks drafted ahead


@dataclass
class Draft:
    """A round's drafts, in draft order (host lists), and p_draft on the device."""
    pos: list       # positions; B and on: a later block's, position p at p % B of block p // B
    tokens: list    # d_i
    tau: list       # step labels 1, 2, ... (equal within one drafter step)
    p_draft: torch.Tensor = None   # (n, V) the drafter's distribution where each was drafted
    reach: list = None             # p_draft's running product: the odds of reaching each


def draft(sess, front, rule, steps, ahead, threshold, stop, gamma, stops, generator=None):
    """The drafter's decoding of the open block and `ahead` blocks past it: `steps` forwards
    over the window, each revealing, in the first block with a mask left, its most confident
    position and every other above `threshold` (where it drafts never depends on the draw: the
    proposal there is exactly p_draft); it stops once the best confidence left is below `stop`,
    after `gamma` drafts, or past a block holding a `stops` id. -> Draft, ONE host sync."""
    B, mask_id, W = rule.block_size, rule.mask_id, (1 + ahead) * rule.block_size
    window = torch.cat([front.block, front.block.new_full((ahead * B,), mask_id)])
    pos = front.pos[0] + torch.arange(W, device=window.device)
    block_of = torch.arange(W, device=window.device) // B
    tau, key = torch.zeros_like(window), torch.zeros_like(window)    # step label, draft order
    p_at, alive = None, torch.ones((), dtype=torch.bool, device=window.device)
    ends = to_device(sorted(stops), window.device)
    for t in range(1, min(steps, front.n_masked + ahead * B) + 1):
        logits = sess.forward(window, pos, lambda c, k: masks.block_causal(B, c), keep=W)
        masked = window == mask_id
        active = masked.view(-1, B).any(-1).int().argmax()     # the first block with a mask
        alive &= ~(torch.isin(window, ends) & (block_of < active)).any()
        can = masked & (block_of == active) & alive
        conf = rule.best(logits)[1].masked_fill(~can, -1.0)
        rank = conf.sort(descending=True, stable=True).indices.argsort()  # each position's
        n = (conf > threshold).sum().clamp(min=1) if threshold else torch.ones_like(active)
        reveal = can & (rank < torch.minimum(n, gamma - (tau > 0).sum()))
        p, tok = rule.probs(logits), rule.pick(logits, generator)[0]
        window = torch.where(reveal, tok, window)
        tau, key = torch.where(reveal, t, tau), torch.where(reveal, t * W + rank, key)
        p_at = p if p_at is None else torch.where(reveal[:, None], p, p_at)
        if stop:                                   # the best confidence left, below `stop`
            best_left = conf.masked_fill(reveal, -1.0).amax()
            alive &= (best_left < 0) | (best_left >= stop)
    reach = p_at.gather(-1, window[:, None]).squeeze(-1)
    tokens, tau, key, reach = to_host(window, tau, key, reach)          # the one host sync
    at = sorted((i for i in range(W) if tau[i]), key=key.__getitem__)
    reach = list(accumulate((reach[i] for i in at), lambda a, b: a * b))   # p_draft's product
    return Draft(at, [tokens[i] for i in at], [tau[i] for i in at],
                 p_at[to_device(at, window.device)], reach)


def drafted_states(front, d, ahead, stops, mask_id, every=True):
    """A Draft's states as verify.Guesses: the open block before the first draft and after
    each (every), or after each drafter step (a rule that reveals several tokens a step
    rarely stops inside one); a later block's from all masks, after the complete state of the
    block before it; after a complete last state with no stop id, the next block's first."""
    B, block, state = len(front.host), 0, None
    rows = [(list(front.host), -1, 1.0, 0)]       # (state, parent, reach, drafts it holds)
    for i, p in enumerate(d.pos):
        if p // B > block:                     # on into the next block, after its complete copy
            block = p // B
            rows.append(([mask_id] * B, len(rows) - 1, rows[-1][2], i))
        state = list(rows[-1][0]) if rows[-1][3] == i else state
        state[p % B] = d.tokens[i]
        if every or i + 1 == len(d.pos) or d.tau[i + 1] != d.tau[i]:
            rows.append((state, rows[-1][1], d.reach[i] if d.reach else 1.0, i + 1))
    if mask_id not in rows[-1][0] and block < ahead and not stops.intersection(rows[-1][0]):
        rows.append(([mask_id] * B, len(rows) - 1, rows[-1][2], len(d.pos)))
    states, parent, reach, drafted = map(list, zip(*rows))
    copies = to_device(states, front.block.device) if len(states) > 1 else front.block[None]
    return Guesses(copies, [s.count(mask_id) for s in states],
                   parent if max(parent) >= 0 else None, reach, drafted)


def verify_temporal(sess, front, d, rule, rope_copy=True):
    """The paper's verifier: ONE target forward over [data section | mask section] under the
    token-level temporal mask (mask.simsd_temporal): known and drafted tokens as data, a mask
    slot for each drafted position with its step, and one for each undrafted masked position
    after every step, at its data token's RoPE position (rope_copy; the ablation continues
    the sequence after the block). -> (slots, V) logits, the drafts' first, in draft order."""
    host, mask_id, B = front.host, rule.mask_id, rule.block_size
    known = [i for i, t in enumerate(host) if t != mask_id]
    rest = undrafted(front, d, mask_id)
    data, slots = known + d.pos, d.pos + rest
    step = [0] * len(known) + d.tau + d.tau + [max(d.tau, default=0) + 1] * len(rest)
    is_slot = [0] * len(data) + [1] * len(slots) + [0] * (2 * B - len(step))
    step += [0] * (2 * B - len(step))      # 2B long: one compiled graph for every section
    tokens = [host[i] for i in known] + d.tokens + [mask_id] * len(slots)
    at = [*data, *slots] if rope_copy else [*data, *range(B, B + len(slots))]
    (step, is_slot), (tokens, at) = (to_device(x, front.block.device) for x in
                                     ([step, is_slot], [tokens, at]))
    return sess.forward(tokens, front.pos[0] + at, lambda c, n: masks.simsd_temporal(
        c, n, step, is_slot.bool()), keep=len(slots))


def agree(p_target, d, rule, generator=None):
    """(n,) bool: the target accepts each draft; greedy: its argmax is d; sampling:
    u < p_target(d) / p_draft(d) (speculative sampling, one uniform draw a draft)."""
    tokens = to_device(d.tokens, p_target.device)[:, None]
    if rule.temperature == 0:
        return p_target.argmax(-1) == tokens[:, 0]
    u = torch.rand(len(tokens), generator=generator, device=p_target.device)
    return u * d.p_draft.gather(-1, tokens)[:, 0] < p_target.gather(-1, tokens)[:, 0]


def correct(p_target, p_draft, rule, generator=None):
    """Each row's token if its draft is rejected: drawn from norm(max(0, p_target - p_draft))
    (p_target if all zero; torch.multinomial's Exp(1) race, no sync), argmax when greedy."""
    if rule.temperature == 0:
        return p_target.argmax(-1)
    residual = (p_target - p_draft).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target)
    return (residual / torch.empty_like(residual).exponential_(generator=generator)).argmax(-1)


def accept_temporal(logits, front, d, rule, generator=None):
    """The paper's acceptance along the step map: the drafts are accepted in draft order while
    the target agrees; the first rejected one gets the target's correction; if every one is
    accepted and masks remain, the target reveals its most confident undrafted position (a
    bonus). -> (the new block, drafts accepted), still on the device."""
    n, block = len(d.pos), front.block.clone()
    p_target = rule.probs(logits)                                    # (slots, V)
    ok = agree(p_target[:n], d, rule, generator)
    k = torch.cat([~ok, ok.new_ones(1)]).int().argmax()              # drafts accepted
    if n:
        i, tokens = torch.arange(n, device=block.device), to_device(d.tokens, block.device)
        fix = correct(p_target[:n], d.p_draft, rule, generator)
        block[to_device(d.pos, block.device)] = torch.where(i < k, tokens, torch.where(
            i == k, fix, rule.mask_id))
    if len(logits) > n:                                             # the bonus, if all accepted
        tok, confidence = rule.pick(logits[n:], generator)
        at = to_device(undrafted(front, d, rule.mask_id), block.device)[confidence.argmax()]
        block[at] = torch.where(k == n, tok[confidence.argmax()], block[at])
    return block, k


def undrafted(front, d, mask_id):
    """The open block's masked positions the draft left alone, in order (host)."""
    return [i for i, t in enumerate(front.host) if t == mask_id and i not in d.pos]


def temporal_round(sess, propose, rule, rope_copy, order, generator, counts, extra):
    """A round of the paper's own path: propose(front, 0) -> a Draft of the open block;
    verify_temporal; accept_temporal. order="position": the paper's ablation, the drafts
    revealed left to right, one a step. extra: verify.walk's, on the slots' logits."""
    def round_(front, left):
        d = propose(front, 0)
        if order == "position":          # left to right, one a step
            by = sorted(range(len(d.pos)), key=d.pos.__getitem__)
            d = Draft(sorted(d.pos), [d.tokens[i] for i in by], [i + 1 for i in range(len(by))],
                      d.p_draft[to_device(by, front.block.device)], d.reach)
        logits = verify_temporal(sess, front, d, rule, rope_copy)
        block, k = accept_temporal(logits, front, d, rule, generator)
        slots = d.pos + undrafted(front, d, rule.mask_id)      # the slots by position:
        by_position = to_device(sorted(range(len(slots)), key=slots.__getitem__), block.device)
        more = extra(logits[by_position], front.block[None], block[None])
        host, k, *ranks = to_host(block, k, *more)
        if counts is not None:
            counts.ended(k, "every draft accepted" if k == len(d.pos) else "draft rejected")
        return Advance([], Frontier(block, front.pos, host.count(rule.mask_id), host,
                                    front.step + 1, tuple(h[0] for h in ranks)))
    return round_


def copies_round(sess, propose, rule, ahead, stops, generator, counts, extra, walk, cut, accept):
    """A round of the lossless path: propose(front, ahead) -> a Draft; its states as block
    copies (drafted_states), cut(guesses) -> those verified (None: all), in ONE forward, the
    rule walked through them. accept: an ablation's acceptance instead of the walk."""
    every = accept is not None or rule.strategy not in ("low_confidence_dynamic", "entropy_bounded")

    def guesses(front, left):
        ahead_ = min(ahead, max(0, -(-left // rule.block_size)))     # blocks left to decode
        d = propose(front, ahead_)
        return d, drafted_states(front, d, ahead_, stops, rule.mask_id, every)
    if accept is not None:                   # (every drafted state verified: no cut)
        def round_(front, left):
            d, g = guesses(front, left)
            return accept(verify_copies(sess, g, front.pos), g, d, front, rule, generator, counts)
        return round_
    return lossless_round(sess, rule, lambda front, left: (cut or (lambda g: g))(
        guesses(front, left)[1]), generator, extra, walk, counts)


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, verifier="copies",
                   draft_steps=None, draft_threshold=DRAFT_THRESHOLD,
                   draft_stop=DRAFT_STOP, gamma=None, lookahead=None, rope_copy=True, order="tau",
                   fuse_commit=True, eos_id=None, generator=None, on_block=None, counts=None,
                   walk=walk, cut=None, propose=None, extra=no_extra, accept=None):
    """SimSD decoding; decode.generate's arguments and output, plus: drafter, a Transformer of
    the target's vocabulary; verifier: "copies" (lossless) or "temporal" (the paper's);
    draft_steps, draft_threshold, draft_stop, gamma: `draft`'s; lookahead: blocks past the
    open one a round may draft (copies only); rope_copy, order: the temporal path's ablations;
    counts: a counts.Counts. Speed devices (fast.py): walk, cut. Variants (variants.py):
    propose(front, ahead) -> Draft instead of the drafter, extra (walk's), accept (on copies)."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    B, temporal = rule.block_size, verifier == "temporal"
    lookahead = (0 if temporal else LOOKAHEAD) if lookahead is None else lookahead
    gamma = B * (1 + lookahead) if gamma is None else gamma
    if draft_steps is None:      # one token a step (no draft_threshold): gamma steps, the paper's
        draft_steps = DRAFT_STEPS.get(B, 1) if draft_threshold else gamma
    check_settings(verifier, lookahead, gamma, draft_steps, draft_threshold, draft_stop, rope_copy,
                   order)
    ids, stops = check_prompt(prompt, c, max_new_tokens), stop_ids(c, eos_id)
    longest = len(ids) + max_new_tokens
    drafts = (1 + lookahead) * B if propose else min(gamma, (1 + lookahead) * B)   # a copy each
    sessions = [Session(target, B, longest + (drafts + lookahead + 5) * B, fuse_commit)]
    if propose is None:
        if ((d := drafter.config).vocab_size, d.mask_token_id) != (c.vocab_size, c.mask_token_id):
            raise ValueError("drafter and target differ in vocabulary size or mask token id")
        sessions.append(Session(drafter, B, longest + (lookahead + 4) * B, fuse_commit))
        stream = torch.Generator(sessions[0].device).manual_seed(   # the drafter's own draws
            (generator or torch).initial_seed() + 1)
        propose = lambda front, ahead: draft(sessions[1], front, rule, draft_steps, ahead,  # noqa
                                             draft_threshold, draft_stop, gamma, stops, stream)
    round_ = temporal_round(sessions[0], propose, rule, rope_copy, order, generator, counts,
                            extra) if temporal else copies_round(
        sessions[0], propose, rule, lookahead, stops, generator, counts, extra, walk, cut, accept)
    out, run = round_loop(round_, sessions, ids, rule, max_new_tokens, stops, on_block)
    return out, dict(run, lookahead=lookahead, nfe_draft=sum(s.nfe for s in sessions[1:]),
                     rows_draft=dict(sessions[1].rows) if sessions[1:] else {})


def check_settings(verifier, lookahead, gamma, steps, threshold, stop, rope_copy, order):
    """Refuse settings that are unknown or that the chosen verifier cannot honour."""
    if verifier not in ("copies", "temporal") or order not in ("tau", "position"):
        raise ValueError(f"unknown verifier (--verify) {verifier!r} or order {order!r}: choose "
                         "copies or temporal, tau or position")
    if verifier == "copies" and (not rope_copy or order != "tau"):
        raise ValueError("the rope-copy and order ablations apply to the temporal verifier only")
    if type(lookahead) is not int or lookahead < 0:
        raise ValueError(f"--lookahead must be an integer >= 0, got {lookahead!r}")
    if lookahead and verifier == "temporal":
        raise ValueError("--lookahead needs --verify copies: the temporal mask verifies one block")
    if gamma < 1 or steps < 1:
        raise ValueError(f"gamma and --draft-steps must be >= 1, got {gamma} and {steps}")
    if not all(x is None or 0 < x <= 1 for x in (threshold, stop)):
        raise ValueError(f"draft_threshold and draft_stop must be in (0, 1]: {threshold}, {stop}")
