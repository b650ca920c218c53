"""SimSD's variants, which the command lines compose with speculate.simsd_generate: two sources
of drafts that need no drafter, and the acceptance ablations on block copies.

The SimSD paper takes its reference tokens "either from a smaller draft model, or from
previously decoded trajectories". Two of the second kind, proposers (front, ahead) -> Draft
that run no forward of their own:
  trajectory  the target's own last forward: at the open block's state, its most likely token
              at every masked position, revealed in its own confidence order (the threshold
              rule's first step at once, then one a step). Read off the ranks the last walk
              brought back (Frontier.ranks; `best_token_ranks` is the walk's extra that makes them).
  lookup      prompt-lookup decoding's n-gram match: the most recent earlier occurrence, in the
              prompt and the text decoded so far (Frontier.context), of the last n tokens
              before the open block's first mask, and the tokens that followed it, on into
              later blocks. No match: nothing proposed, and the round is a plain step.
Both propose fixed tokens, a point proposal: p_draft is one-hot where the paper's acceptance
reads it (`one_hot_draft`), and the lossless walk never reads it.

The acceptance ablations on the drafter's states as exact block copies (not lossless):
"paper" accepts along the draft order while the target agrees (greedy match, or speculative
sampling with the residual); "gated" only where the target is also sure of that position in
that state, else the target's own step ends the round (docs/results.md: what loses answers at
large B is the ORDER the drafter reveals positions in).
"""
from dataclasses import replace

import torch
import torch.nn.functional as F

from decode import (Advance, DecodeRule, Frontier, packed_index, stop_ids,
                    to_device, to_host)
from measure.counts import counting
from speculate import Draft, Settings, agree, correct, draft, simsd_generate
from verify import first_true
from verify import no_extra

LOOKUP_N = 3          # the n-gram lookup matches (docs/results.md: by measurement)
LOOKUP_CHANCE = (0.3, 0.85)   # lookup's guess that its first token is kept, and each next one
                              # after it (fast.sized only; experiments/lookup_keep.py measured
                              # 0.12-0.57, 0.4-0.93)
GATE = 0.9   # gated acceptance: the target confidence it accepts at
REFERENCES, ACCEPTS = ("drafter", "trajectory", "lookup"), ("paper", "gated", "lossless")


def trajectory(front, rule):
    """The target's trajectory from the open block's state, read off front.ranks (the ranks of
    the last forward at this state: positions by confidence, each one's best token and its
    probability), inside the open block only. A state no forward has seen (a new block)
    proposes nothing."""
    if not front.ranks:
        return Draft([], [], [])
    order, tok, p = front.ranks
    m = front.n_masked
    first = sum(p[i][0] > rule.threshold for i in range(m)) if rule.strategy == \
        "low_confidence_dynamic" else 1                      # the threshold rule's first step
    reach = [p[0][0]]
    for i in range(1, m):
        reach.append(reach[-1] * p[i][0])
    return Draft(order[:m], [tok[i][0] for i in range(m)],
                 [max(1, i + 2 - max(first, 1)) for i in range(m)], None, reach)


def lookup(context, n, want):
    """Prompt lookup: the (at most `want`) tokens that followed the most recent earlier
    occurrence of context's last n tokens; [] if they never occurred before."""
    key = context[len(context) - n:]
    for s in range(len(context) - n - 1, -1, -1) if len(context) > n else ():
        if context[s:s + n] == key:
            return context[s + n:s + n + want]
    return []


def lookup_draft(front, rule, n, ahead, stops, by_confidence=True):
    """The lookup proposal for the open block, then up to `ahead` later blocks: the tokens
    that followed the last match of the n tokens before the block's first mask, position by
    position, up to a known position that holds another token, or past a block that holds a
    stop id. The open block's drafts in the order of the last forward's confidence
    (front.ranks, when by_confidence and there is one), else left to right."""
    B, mask, state = rule.block_size, rule.mask_id, front.host
    lead = next((i for i, t in enumerate(state) if t == mask), B)
    guess = lookup(list(front.context) + state[:lead], n, B - lead + ahead * B)
    full, pos = state[:lead], []
    for p, t in enumerate(guess, lead):
        if p < B and state[p] != mask and state[p] != t:     # the match broke
            break
        if p % B == 0 and p and stops.intersection(full[p - B:p]):
            break
        full.append(t)
        if p >= B or state[p] == mask:
            pos.append(p)
    if by_confidence and front.ranks:                                # the open block by confidence
        rank = {q: r for r, q in enumerate(front.ranks[0])}
        inside = [p for p in pos if p < B]
        pos = sorted(inside, key=rank.get) + pos[len(inside):]
    reach = [LOOKUP_CHANCE[0] * LOOKUP_CHANCE[1] ** i for i in range(len(pos))]
    return Draft(pos, [full[p] for p in pos], list(range(1, len(pos) + 1)), None, reach)


def one_hot_draft(d, vocab, device):
    """d with one-hot p_draft (a point proposal), as the paper's acceptance reads it."""
    return replace(d, p_draft=F.one_hot(to_device(d.tokens, device), vocab).float())


def best_token_ranks(rule):
    """The walk's `extra` for the drafter-free sources: each new state's positions by the
    confidence of their best token under the logits it was stepped from (masked ones first),
    each one's best token and its confidence ((..., B), (..., B, 1), (..., B, 1): spiffy.ranks'
    shapes, in one pass over the logits: DecodeRule.best)."""
    def extra(logits, copies, states):
        tokens, conf = rule.best(logits)
        at = packed_index(copies, rule.mask_id)                    # (..., B): each one's row
        conf = conf[at].masked_fill(states != rule.mask_id, -1.0)
        order = conf.sort(dim=-1, descending=True, stable=True).indices
        return order, tokens[at].gather(-1, order)[..., None], conf.gather(-1, order)[..., None]
    return extra


def on_copies(accept_rule, gate=GATE):
    """An acceptance ablation as simsd_generate's `accept`: accept_rule ("paper" or "gated") on
    the logits of the drafter's states as block copies (every drafted state verified). ->
    accept(logits, guesses, draft, front, rule, generator, counts) -> decode.Advance."""
    def accept(logits, g, d, front, rule, generator, counts):
        drafted_in = [g.drafted.index(k + 1) - 1 for k in range(len(d.pos))]   # copy before draft k
        at = [p % g.copies.shape[1] for p in d.pos]                             # and its position
        p_target = rule.probs(logits[packed_index(g.copies, rule.mask_id)[
            to_device(drafted_in, g.copies.device), to_device(at, g.copies.device)]])
        ok = agree(p_target, d, rule, generator)
        gated = accept_rule == "gated"
        sure = target_sure(logits, g.copies, d, drafted_in, rule, gate) if gated else ok
        k, sure = map(int, to_host(first_true(~(ok & sure)), first_true(~sure)))
        c = drafted_in[k] if k < len(drafted_in) else len(g.n_masked) - 1
        crossed, taken = ended_in(g.after, c)
        block, steps = g.copies[c].clone(), taken
        if k < len(drafted_in) and (k < sure or not gated):     # rejected (and, gated, sure):
            block[d.pos[k] % len(block)] = correct(p_target[k], d.p_draft[k], rule, generator)
            why, steps = "draft rejected", taken + 1                       # the correction
        else:                       # every draft accepted, or the target unsure: its own step
            why = "every draft accepted" if k == len(drafted_in) else "target unsure"
            if g.n_masked[c]:
                at = front.step + taken if not crossed else taken
                block = rule(logits.split(g.n_masked)[c], g.copies[c], at, generator)
                steps += 1
        copies, host = to_host(g.copies, block)
        if counts is not None:
            counts.ended(k, why)
        step = steps if crossed else front.step + steps
        pos = front.pos + rule.block_size * len(crossed)
        return Advance([(g.copies[j], copies[j], j) for j in crossed], Frontier(
            block, pos, host.count(rule.mask_id), host, step))
    return accept


def target_sure(logits, copies, d, drafted_in, rule, gate):
    """(n,) bool: the target is sure of draft k's position in the state it was drafted in: it
    is the target's most confident masked position there, or its confidence is above gate."""
    pos = to_device(d.pos, copies.device) % copies.shape[1]
    top = rule.best(logits)[1][packed_index(copies, rule.mask_id)]    # (m, B)
    top = top.masked_fill(copies != rule.mask_id, -1.0)[to_device(drafted_in, copies.device)]
    return (top.argmax(-1) == pos) | (top[torch.arange(len(pos), device=pos.device), pos] > gate)


def ended_in(after, c):
    """A round that ends in copy c: the complete copies of the blocks it went past, and the
    drafts it took in c's own block (host ints)."""
    crossed, a = [], c
    while after is not None and after[a] >= 0:
        a = after[a]
        crossed.insert(0, a)
    return crossed, c - (after[c] + 1 if after else 0)


def simsd(target, drafter, prompt, max_new_tokens=64, rule=None, acceptance="lossless",
          reference="drafter", lookup_n=LOOKUP_N, gate=GATE, order="tau", eos_id=None,
          generator=None, on_block=None, **settings):
    """speculate.simsd_generate with the command lines' names: acceptance ("lossless", or on
    copies "paper" or "gated"; the temporal verifier's is always the paper's), reference
    ("drafter", "trajectory", or "lookup" of lookup_n-grams: no drafter), order ("tau", or
    the temporal path's ablation "position"); settings: speculate.Settings' fields. Its rounds
    counted (measure/counts.py)."""
    s = Settings(**settings)
    temporal = s.verifier == "temporal"
    check(temporal, acceptance, reference, lookup_n, gate, order)
    check_drafter(reference, drafter, target.config)
    rule = rule or DecodeRule(target.config.mask_token_id, target.config.block_size)
    stops, device = stop_ids(target.config, eos_id), target.embed.weight.device
    if reference == "trajectory":
        s.propose = lambda front, ahead: trajectory(front, rule)       # (the open block only)
    elif reference == "lookup":
        s.propose = lambda front, ahead: lookup_draft(front, rule, lookup_n, ahead, stops,
                                                      by_confidence=not temporal)
    if reference != "drafter":
        s.extra = no_extra if reference == "lookup" and temporal else best_token_ranks(rule)
    if reference != "drafter" and temporal:          # a point proposal, as the paper reads it
        s.propose = then(s.propose, lambda d: one_hot_draft(d, target.config.vocab_size, device))
    if order == "position" and s.propose:            # the drafts left to right, one a step
        s.propose = then(s.propose, by_position)
    elif order == "position":
        s.draft = then(s.draft or draft, by_position)
    if acceptance in ("paper", "gated") and not temporal:
        s.accept = on_copies(acceptance, gate)
    out, stats = counting(simsd_generate)(target, drafter, prompt, max_new_tokens, rule, s,
                                          eos_id=eos_id, generator=generator, on_block=on_block)
    return out, dict(stats, reference=reference)


def then(f, g):
    """f, then g on its result."""
    return lambda *args: g(f(*args))


def by_position(d):
    """The paper's order ablation: d's drafts revealed left to right, one a step."""
    by = sorted(range(len(d.pos)), key=d.pos.__getitem__)
    return Draft(sorted(d.pos), [d.tokens[i] for i in by], list(range(1, len(by) + 1)),
                 d.p_draft[to_device(by, d.p_draft.device)], d.reach)


def check(temporal, acceptance, reference, lookup_n, gate, order="tau"):
    """Refuse the variants' settings that are unknown or that cannot go together."""
    if order not in ("tau", "position"):
        raise ValueError(f"unknown order {order!r}: choose tau or position")
    if order != "tau" and not temporal:
        raise ValueError("the order ablation applies to the temporal verifier only")
    if reference not in REFERENCES:
        raise ValueError(f"unknown --reference {reference!r}; choose from {', '.join(REFERENCES)}")
    if acceptance not in ACCEPTS:
        raise ValueError(f"unknown acceptance rule (--accept) {acceptance!r}; choose from "
                         f"{', '.join(ACCEPTS)}")
    if temporal and acceptance != "paper":
        raise ValueError(f"--verify temporal needs --accept paper (not {acceptance}): the temporal "
                         "mask gives no exact logits of the whole block at a drafted state")
    if reference != "drafter" and acceptance in ("paper", "gated") and not temporal:
        raise ValueError(f"--reference {reference} runs --verify copies --accept lossless or "
                         f"--verify temporal --accept paper, not --accept {acceptance} on copies")
    if type(lookup_n) is not int or lookup_n < 1:
        raise ValueError(f"--lookup-n must be an integer >= 1, got {lookup_n!r}")
    if gate is not None and not 0 < gate <= 1:
        raise ValueError(f"gate must be in (0, 1], got {gate}")


def check_drafter(reference, drafter, config):
    """A drafter exactly when the reference is one (its vocabulary: speculate.simsd_generate)."""
    if reference == "drafter" and drafter is None:
        raise ValueError("--reference drafter needs a drafter (or choose --reference trajectory "
                         "or lookup: no second model)")
    if reference != "drafter" and drafter is not None:
        raise ValueError(f"a drafter was given with --reference {reference}, which needs none")
