"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

docs/design.md, section 3 (after the SimSD paper). Each round of the loop (decode.round_loop):
  draft   the drafter decodes the open block and up to `lookahead` blocks past it (draft), each
          drafted token d_i with its step label tau(i) and its distribution p_draft(i).
  verify  lossless (the default): the drafter's states as block copies in ONE target forward,
          the target's own rule walked through them (verify.py): plain decoding's tokens, fp32.
          temporal (the paper's): ONE forward over [data | mask section] under the token-level
          temporal mask (verify_temporal), drafts accepted along tau (accept_temporal): lossy.
"""
from dataclasses import dataclass, replace
from itertools import accumulate, count

import torch

import mask as masks
from decode import (Advance, DecodeRule, Frontier, Session, check_prompt, round_loop, stop_ids,
                    to_device, to_host)
from verify import Guesses, lossless_round, no_extra, verify_copies, walk

DRAFT_THRESHOLD, DRAFT_STOP = 0.9, 0.3   # the rule's threshold: a drafter step as the target's
DRAFT_STEPS, LOOKAHEAD = {4: 3, 8: 3}, 3   # drafter forwards a round by B (else 2); blocks ahead


@dataclass
class Draft:
    """A round's drafts, in draft order (host lists), and p_draft on the device."""
    pos: list       # positions; B and on: a later block's, position p at p % B of block p // B
    tokens: list    # d_i
    tau: list       # step labels 1, 2, ... (equal within one drafter step)
    p_draft: torch.Tensor = None   # (n, V) the drafter's distribution where each was drafted
    reach: list = None             # p_draft's running product: the odds of reaching each
    more: dict = None              # step label -> (position, token): the surest it left masked


@dataclass
class Settings:
    """SimSD's settings (--verify, ...; None: a default by B), then the parts swapped in."""
    verifier: str = "copies"     # "copies": lossless; "temporal": the paper's (verify_temporal)
    lookahead: int = None        # blocks past the open one a round drafts (copies: LOOKAHEAD)
    gamma: int = None            # the most drafts a round (default: the whole window)
    draft_steps: int = None      # drafter forwards a round (DRAFT_STEPS; no threshold: gamma)
    draft_threshold: float = DRAFT_THRESHOLD   # a drafter step reveals every one above it,
    draft_stop: float = DRAFT_STOP             # and stops once the best left is below this
    rope_copy: bool = True       # temporal: slots at their tokens' RoPE positions (ablation)
    fuse_commit: bool = True     # decode.Session's
    vary: bool = True            # the walk's copies: each step's siblings too (drafted_states)
    draft: callable = None       # the drafter's loop (None: draft; fast.draft_one_sync: one sync)
    walk: callable = walk        # the lossless walk (verify.walk_one_sync: the same, one host sync)
    cut: callable = None         # Guesses -> the copies verified (fast.cutter)
    propose: callable = None     # (front, blocks ahead) -> Draft, instead of a drafter
    extra: callable = no_extra   # the walk's extra rows (variants.best_token_ranks)
    accept: callable = None      # an acceptance on the copies instead of the walk

    def for_block(self, B):
        """These settings with the defaults for block size B filled in, checked."""
        k, gamma, steps = self.lookahead, self.gamma, self.draft_steps
        k = (0 if self.verifier == "temporal" else LOOKAHEAD) if k is None else k
        gamma = B * (1 + k) if gamma is None else gamma
        if steps is None:     # one token a step (no draft_threshold): gamma steps, the paper's
            steps = DRAFT_STEPS.get(B, 2) if self.draft_threshold else gamma
        return replace(self, lookahead=k, gamma=gamma, draft_steps=steps).check()

    def check(self):
        """Refuse settings that are unknown or that the verifier cannot honour. -> self."""
        k, g, n, v = self.lookahead, self.gamma, self.draft_steps, self.verifier
        if v not in ("copies", "temporal") or not (v == "temporal" or self.rope_copy):
            raise ValueError(f"--verify {v!r}, rope_copy={self.rope_copy}: the verifier is copies"
                             " or temporal, and the rope-copy ablation is the temporal one's")
        if k is not None and (type(k) is not int or k < 0 or k and v == "temporal"):
            raise ValueError(f"--lookahead must be an int >= 0 (0 with --verify temporal): {k!r}")
        if any(x is not None and x < 1 for x in (g, n)):
            raise ValueError(f"gamma and --draft-steps must be >= 1, got {g} and {n}")
        if not all(x is None or 0 < x <= 1 for x in (self.draft_threshold, self.draft_stop)):
            raise ValueError(f"draft_threshold and draft_stop must be in (0, 1]: "
                             f"{self.draft_threshold}, {self.draft_stop}")
        return self


def draft(sess, front, rule, s, ahead, stops, generator=None):
    """The drafter decodes the open block, then up to `ahead` blocks past it, in at most
    s.draft_steps forwards, each revealing in the first block with a mask its most confident
    position and every other above s.draft_threshold, with the tokens drawn (the proposal is
    exactly p_draft: where it drafts never depends on the draw). It stops after s.gamma drafts,
    below s.draft_stop, or past a block with a `stops` id. -> Draft; a host sync a step."""
    B, mask_id, gamma = rule.block_size, rule.mask_id, s.gamma
    window = list(front.host) + [mask_id] * (ahead * B)      # all masks past the open block
    pos = front.pos[0] + torch.arange(len(window), device=front.pos.device)
    d, p_draft = Draft([], [], [], more={}), []
    for t in range(1, s.draft_steps + 1):
        if mask_id not in window or len(d.pos) == gamma:
            break
        b = window.index(mask_id) // B                       # the first block with a mask
        if stops.intersection(window[:b * B]):               # past a block with a stop id
            break
        logits = sess.forward(to_device(window, pos.device), pos, keep=len(window))
        tokens, conf = to_host(rule.pick(logits, generator)[0], rule.best(logits)[1])
        masked = sorted((i for i in range(b * B, b * B + B) if window[i] == mask_id),
                        key=lambda i: -conf[i])              # most confident first
        n = max(1, sum(conf[i] > s.draft_threshold for i in masked)) if s.draft_threshold else 1
        n = min(n, gamma - len(d.pos))
        probs = rule.probs(logits)
        for i in masked[:n]:
            window[i] = tokens[i]
            d.pos.append(i), d.tokens.append(tokens[i]), d.tau.append(t), p_draft.append(probs[i])
        if masked[n:]:
            d.more[t] = masked[n], tokens[masked[n]]
        if s.draft_stop and masked[n:] and conf[masked[n]] < s.draft_stop:
            break
    d.p_draft = torch.stack(p_draft)      # reach: the running product of p_draft(d_i)
    p, = to_host(d.p_draft.gather(-1, to_device(d.tokens, pos.device)[:, None])[:, 0])
    d.reach = list(accumulate(p, lambda a, b: a * b))
    return d


def drafted_states(front, d, ahead, stops, mask_id, every=True, vary=False):
    """A Draft's states as verify.Guesses (drawn: docs/design.md, section 6): the open block, its
    state after each draft (every) or drafter step, a later block's after the block before's
    complete copy, and after a complete last one with no stop id, if `ahead` allows, the next's.
    Then, if `vary` (a copy a drafter step), each step's siblings (d.more): a rule that reveals
    what IT is sure of often differs from a drafter step by one position, so the step's state
    also goes one draft fewer, one more (the surest it left masked), and with its last draft
    swapped for that one."""
    B, state, block, follows, odds = len(front.host), list(front.host), 0, -1, 1.0
    rows, side = [(list(state), follows, odds, 0)], []   # a copy: (state, after, reach, drafts)
    for i, p in enumerate(d.pos):
        if p // B > block:   # a drafter step stays in one block, so the last copy is complete
            assert mask_id not in rows[-1][0], f"draft {i} is past a block still masked"
            block, state, follows = p // B, [mask_id] * B, len(rows) - 1
            rows.append((list(state), follows, odds, i))
        state[p % B], odds = d.tokens[i], d.reach[i] if d.reach else 1.0
        ends = i + 1 == len(d.pos) or d.tau[i + 1] != d.tau[i]      # the step's last draft
        if every or ends:
            rows.append((list(state), follows, odds, i + 1))
        if ends and vary and d.more:       # (fewer: only if the step drafted more than this one)
            more, fewer = d.more.get(d.tau[i]), i > 0 and d.tau[i - 1] == d.tau[i]
            side += [(x, follows, odds, i) for x in siblings(state, p % B, more, mask_id, fewer)]
    if mask_id not in state and block < ahead and not stops.intersection(state):
        rows.append(([mask_id] * B, len(rows) - 1, odds, len(d.pos)))
    seen = {(tuple(x), a) for x, a, _, _ in rows}
    for row in side:                       # (a sibling may be a state drafted later, or another's)
        if (tuple(row[0]), row[1]) not in seen:
            seen.add((tuple(row[0]), row[1])), rows.append(row)
    states, after, reach, drafted = map(list, zip(*rows))
    copies = to_device(states, front.block.device) if len(states) > 1 else front.block[None]
    return Guesses(copies, [s.count(mask_id) for s in states],
                   after if max(after) >= 0 else None, reach, drafted)


def siblings(state, last, more, mask_id, fewer):
    """A drafter step's state varied by one position (drafted_states): without its last draft
    (fewer), with `more` (position, token) added, and with `more` in place of its last draft;
    those left with a mask (a complete one has nothing to go on to)."""
    put = lambda x, i, t: [t if j == i else u for j, u in enumerate(x)]   # noqa: E731
    without = put(state, last, mask_id)
    out = [without] if fewer else []
    if more is not None:
        at = more[0] % len(state)
        out += [put(state, at, more[1]), put(without, at, more[1])]
    return [x for x in out if mask_id in x]


def verify_temporal(sess, front, d, rule, rope_copy=True):
    """The paper's verifier: ONE target forward over [data section | mask section] under the
    token-level temporal mask (mask.simsd_temporal): known and drafted tokens as data, a mask
    slot for each draft with its step and one for each undrafted position after every step, at
    its token's RoPE position (rope_copy; the ablation puts the slots after the block). ->
    (slots, V) logits, the drafts' first, in draft order."""
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
    return sess.forward(tokens, front.pos[0] + at, lambda prefix, n_commit: masks.simsd_temporal(
        prefix, n_commit, step, is_slot.bool()), keep=len(slots))


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
    """The paper's acceptance: the drafts in draft order while the target agrees; the first one
    rejected gets the target's correction; if all are accepted, the target takes its own step
    from there (its rule on the undrafted slots: the paper's bonus token under a one-token
    rule; with nothing drafted, the rule's own step). -> (new block, drafts accepted)."""
    n, block = len(d.pos), front.block.clone()
    k = torch.zeros((), dtype=torch.long, device=block.device)      # drafts accepted
    if n:
        ok = agree(p_target := rule.probs(logits[:n]), d, rule, generator)   # p_target: (n, V)
        k = torch.cat([~ok, ok.new_ones(1)]).int().argmax()
        i, at = torch.arange(n, device=block.device), to_device(d.pos, block.device)
        tokens, fix = to_device(d.tokens, at.device), correct(p_target, d.p_draft, rule, generator)
        rejected, block[at] = block.clone(), tokens                  # block: every draft accepted
        rejected[at] = torch.where(i < k, tokens, torch.where(i == k, fix, rule.mask_id))
    if len(logits) > n:                                              # the target's own step
        block = rule(logits[n:], block, front.step, generator)
    return (torch.where(k == n, block, rejected) if n else block), k


def undrafted(front, d, mask_id):
    """The open block's masked positions the draft left alone, in order (host)."""
    return [i for i, t in enumerate(front.host) if t == mask_id and i not in d.pos]


def temporal_round(sess, rule, s, propose, generator, counts):
    """The paper's round: propose(front, 0), verify_temporal, accept_temporal."""
    def one_round(front, tokens_left):
        d = propose(front, 0)
        logits = verify_temporal(sess, front, d, rule, s.rope_copy)
        block, k = accept_temporal(logits, front, d, rule, generator)
        slots = d.pos + undrafted(front, d, rule.mask_id)      # the slots by position:
        by_position = to_device(sorted(range(len(slots)), key=slots.__getitem__), block.device)
        more = s.extra(logits[by_position], front.block[None], block[None])
        host, k, *ranks = to_host(block, k, *more)
        if counts is not None:
            counts.temporal(d, k)
        return Advance([], Frontier(block, front.pos, host.count(rule.mask_id), host,
                                    front.step + 1, tuple(h[0] for h in ranks)))
    return one_round


def copies_round(sess, rule, s, propose, stops, generator, counts):
    """The lossless round: propose(front, blocks ahead) -> a Draft, its states as copies
    (drafted_states), s.cut of them verified in ONE forward and walked (s.walk or s.accept)."""
    # a copy a draft (one-token rules, acceptances), else a drafter step (docs/design.md, 3: why)
    every = bool(s.accept) or rule.strategy not in ("low_confidence_dynamic", "entropy_bounded")

    def guesses(front, tokens_left):
        blocks = min(s.lookahead, max(0, -(-tokens_left // rule.block_size)))   # left to decode
        d = propose(front, blocks)
        return d, drafted_states(front, d, blocks, stops, rule.mask_id, every,
                                   vary=s.vary and not (s.accept or every))
    if s.accept is not None:                   # (every drafted state verified: no cut)
        def one_round(front, tokens_left):
            d, g = guesses(front, tokens_left)
            return s.accept(verify_copies(sess, g, front.pos), g, d, front, rule, generator, counts)
        return one_round
    return lossless_round(sess, rule, lambda front, left: (s.cut or (lambda g: g))(
        guesses(front, left)[1]), generator, s.extra, s.walk, counts)


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, settings=Settings(),
                   eos_id=None, generator=None, on_block=None, counts=None):
    """SimSD decoding; decode.generate's arguments and output, plus: drafter, a Transformer of
    the target's vocabulary (None: settings.propose); counts: a counts.Counts, told each round."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    B, s = rule.block_size, settings.for_block(rule.block_size)
    ids, stops = check_prompt(prompt, c, max_new_tokens), stop_ids(c, eos_id)
    longest = len(ids) + max_new_tokens           # + the scratch: a round's copies or window
    drafts = (1 + s.lookahead) * B if s.propose else min(s.gamma, (1 + s.lookahead) * B)
    copies = drafts + s.lookahead + 3 * min(drafts, s.draft_steps) + 2   # (siblings: 3 a step)
    sessions = [Session(target, B, longest + (copies + 3) * B, s.fuse_commit)]
    if (propose := s.propose) is None:                    # the drafter proposes
        if ((d := drafter.config).vocab_size, d.mask_token_id) != (c.vocab_size, c.mask_token_id):
            raise ValueError("drafter and target differ in vocabulary size or mask token id")
        sessions.append(Session(drafter, B, longest + (s.lookahead + 4) * B, s.fuse_commit))
        seed, rounds = (generator or torch).initial_seed() + 1, count()   # the drafter's own
        stream = torch.Generator(sessions[0].device)        # draws, seeded afresh each round
        propose = lambda front, ahead: (s.draft or draft)(   # noqa: E731
            sessions[1], front, rule, s, ahead, stops, stream.manual_seed(seed + next(rounds)))
    one_round = temporal_round(sessions[0], rule, s, propose, generator, counts) if \
        s.verifier == "temporal" else copies_round(sessions[0], rule, s, propose, stops,
                                                   generator, counts)
    out, run = round_loop(one_round, sessions, ids, rule, max_new_tokens, stops, on_block)
    return out, dict(run, lookahead=s.lookahead, nfe_draft=sum(x.nfe for x in sessions[1:]),
                     rows_draft=dict(sessions[1].rows) if sessions[1:] else {})
