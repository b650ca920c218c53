"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

docs/design.md, section 3 (after the SimSD paper). The drafter is a proposer for the round loop
(decode.round_loop): each round, on the frontier,
  draft   the drafter runs its own decoding on the open block's masked positions: each forward
          reveals its most confident position (and, with `draft_threshold`, every other one
          above it) until `gamma` tokens are drafted or its confidence falls below
          `draft_stop`; a block drafted whole goes on into the next (`lookahead` blocks). It
          records each drafted token d_i, its draft distribution p_draft(i) and its step label
          tau(i) (the step map).
  verify  its states X_t, X_t + d_1, X_t + d_1 + d_2, ... (and the next block's, after a
          complete one) as whole-block copies, in ONE target forward (verify.verify_copies):
          the target's exact logits in every state the drafter passed through.
  walk    the target's own rule from X_t, through every drafted state it reaches, across the
          block boundary (verify.walk, as in Spiffy): output identical to plain decoding,
          token for token in fp32 (bf16 rounding: see verify.py). A draft counts as accepted
          when the walk passed through a state holding it.
The paper's own verifier (the temporal mask) and acceptance rules (paper, gated), which are not
lossless, are simsd_paper.py; simsd_generate runs either. Host syncs: the drafter reads its
confidences back each forward (how many to draft, when to stop); the walk once a round with a
stateless rule, once a step with a sampled one (verify.walk).

    python sample.py --spec simsd                  # on the embedded models
"""
import bisect
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import torch

import mask as masks
from decode import DecodeRule, Session, check_prompt, round_loop, stop_ids
from simsd_paper import GATE, accept_gated, accept_paper, copies_round, temporal_round
from verify import Guesses, lossless_round

VERIFIERS, ACCEPTS = ("temporal", "copies"), ("paper", "gated", "lossless")
DRAFT_THRESHOLD, DRAFT_STOP = 0.5, 0.3   # chosen by measurement on the embedded pair (README)
LOOKAHEAD = 3   # blocks drafted past the open one (docs/results.md: chosen by measurement)


@dataclass
class Draft:
    pos: torch.Tensor       # (n,) positions drafted this round, in draft order; B and on: a
                            # later block's (lookahead), position p at p % B of block p // B
    tokens: torch.Tensor    # (n,) drafted tokens d_i
    p_draft: torch.Tensor   # (n, V) the drafter's distribution at the step each was revealed
    tau: torch.Tensor       # (n,) step labels 1, 2, ... (the step map; equal within a step)
    per_block: list = None  # host ints: drafts in the block, then in each later block (lookahead)
    mask_id: int = None     # (a later block's states start from all masks)

    def states(self, block):
        """(m, B): the block before each draft and after the last (cumulative reveals); with
        lookahead, then each later block's, from all masks, after the block before it drafted
        whole (complete)."""
        B, chunks, at = len(block), [], 0
        for b, nb in enumerate(self.per_block or [len(self.pos)]):
            base = block if b == 0 else torch.full_like(block, self.mask_id)
            p, t = self.pos[at:at + nb] - b * B, self.tokens[at:at + nb]
            steps = torch.arange(nb + 1, device=block.device)
            after = steps[:, None] > steps[None, :nb]
            copies = base.repeat(nb + 1, 1)
            copies[:, p] = torch.where(after, t, base[p])
            chunks.append(copies)
            at += nb
        return torch.cat(chunks)

    def prefix(self, k):
        """The first k drafts (the blocks they reach; one ending a block keeps the next one's
        first state)."""
        per, left = [], k
        for nb in self.per_block or [len(self.pos)]:
            per.append(min(nb, left))
            left -= per[-1]
            if per[-1] < nb:
                break
        return Draft(self.pos[:k], self.tokens[:k], self.p_draft[:k], self.tau[:k], per,
                     self.mask_id)

    def sized(self, cost):
        """The prefix worth verifying (worth_verifying): the product of the drafter's
        probabilities of each draft's tokens as the chance its state is reached. A host sync."""
        chance = self.p_draft.gather(-1, self.tokens[:, None]).squeeze(-1).cumprod(0).tolist()
        return self.prefix(worth_verifying(chance, self.per_block or [len(self.pos)], cost))

    def layout(self, n_masked, B):
        """For states(): each copy's number of masks (n_masked: the open block's), its parent
        (verify.Guesses'; None without lookahead); and src: the copy each draft was drafted
        in. Host ints only."""
        counts, parent, src = [], [], []
        for b, nb in enumerate(self.per_block or [len(self.pos)]):
            first = len(counts)
            counts += [(B if b else n_masked) - k for k in range(nb + 1)]
            parent += [first - 1 if b else -1] * (nb + 1)
            src += range(first, first + nb)
        return counts, parent if len(self.per_block or ()) > 1 else None, src

    def guesses(self, block, n_masked):
        """The drafted states of the open `block` (n_masked of it masked) as verify.Guesses."""
        counts, parent, _ = self.layout(n_masked, len(block))
        return Guesses(self.states(block), counts, parent, self)


def worth_verifying(chance, per_block, cost):
    """How many drafts to verify: the prefix with the most expected steps a second, drafted
    state k reached with chance[k - 1] (one step for the block's own state), by the measured
    cost(n copies) of a forward (a cost table, costs.py); a draft that ends a block brings the
    next block's first copy with it. Host floats and ints."""
    ends = {sum(per_block[:b + 1]) for b in range(len(per_block) - 1)}   # drafts that end a block
    value, best = 1.0, (1.0 / cost(1), 0)
    for k in range(1, len(chance) + 1):
        value += chance[k - 1]
        best = max(best, (value / cost(k + 1 + sum(e <= k for e in ends)), k))
    return best[1]


def draft(sess, block, pos, rule, gamma, draft_threshold=None, draft_stop=None, generator=None,
          lookahead=0, stops=(), cost=None):
    """The drafter's decoding, for up to gamma tokens. Positions are ranked by the confidence of
    their most likely token, not of the token drawn there, so which position gets drafted does
    not depend on the draw: the proposal at a drafted position is exactly p_draft, as
    speculative sampling needs. Each forward drafts the best position plus every other above
    draft_threshold; drafting stops once the best confidence left is below draft_stop.
    lookahead: once the block is drafted whole (and holds none of the `stops` ids), draft on
    into up to that many later blocks, the drafted block committed to the drafter's cache
    tentatively; the cache is rolled back after (the static cache's rows are overwritten).
    cost (a cost table, costs.py): also stop once the newest drafts are past the prefix worth
    verifying (worth_verifying): they would be drafted for nothing, and later drafts, each
    less likely, pay less still."""
    B, block, rows, per_block, base, chance = rule.block_size, block.clone(), [], [0], None, []
    left = min(gamma, int((block == rule.mask_id).sum()) + lookahead * B)
    while left > 0:
        masked = (block == rule.mask_id).nonzero().squeeze(-1)       # (m,): the rows read
        if not len(masked):                                          # drafted whole: on, ahead
            if len(per_block) > lookahead or stops and stops.intersection(block.tolist()):
                break
            base = sess.committed if base is None else base
            sess.commit(block)                                       # tentatively
            block, pos = torch.full_like(block, rule.mask_id), pos + B
            masked, _ = torch.arange(B, device=block.device), per_block.append(0)
        logits = sess.forward(block, pos, lambda c, k: masks.block_causal(B, c), keep=B,
                              rows=masked)
        p = rule.probs(logits)                                       # (m, V)
        conf = rule.top_confidence(logits)
        conf, order = conf.sort(descending=True, stable=True)
        sure = 1 + int((conf[1:] > draft_threshold).sum()) if draft_threshold else 1
        take = order[:min(sure, left)]
        tok = p[take].argmax(-1) if rule.temperature == 0 else \
            torch.multinomial(p[take], 1, generator=generator).squeeze(-1)
        block[masked[take]] = tok
        rows.append((masked[take] + B * (len(per_block) - 1), tok, p[take]))
        per_block[-1] += len(take)
        left -= len(take)
        if cost:
            last = chance[-1] if chance else 1.0
            p_tok = p[take].gather(-1, tok[:, None]).squeeze(-1)
            chance += [last * c for c in p_tok.cumprod(0).tolist()]
            if worth_verifying(chance, per_block, cost) < len(chance):
                break
        if draft_stop and len(take) < len(conf) and conf[len(take)] < draft_stop:
            break
    if base is not None:                                             # roll the cache back
        sess.committed, sess.pending = base, None
    tau = torch.cat([torch.full_like(r[0], s + 1) for s, r in enumerate(rows)])
    return Draft(*(torch.cat(x) for x in zip(*rows)), tau, per_block, rule.mask_id)


def propose_drafts(dsess, rule, draft_kw, lookahead, stops, cost=None):
    """The drafter as a proposer: (front, room) -> the Draft of the open block (draft), never
    past the `room` max_new_tokens leaves, cut to the prefix worth verifying (Draft.sized)
    by the cost model `cost`, if one is given."""
    B = rule.block_size

    def drafts(front, room):
        ahead = min(lookahead, max(0, -(-room // B)))               # blocks of room left
        d = draft(dsess, front.block, front.pos, rule, **draft_kw, lookahead=ahead, stops=stops,
                  cost=cost)
        return d.sized(cost) if cost else d
    return drafts


def accepted(g, w):
    """How many drafts of a round the walk w accepted: the most any state it reached holds
    (a threshold step may reveal several drafts at once). Host values only."""
    d, n = g.data, len(w.copies)
    _, parent, src = d.layout(g.counts[0], len(w.host))
    held = [bisect.bisect_left(src, c) for c in range(n)]   # drafts revealed in copy c (src rises)
    last_block = w.crossed[-1][1] if w.crossed else -1
    parent = parent or [-1] * n
    ended_on = [c for c in range(n) if w.copies[c] == w.host and parent[c] == last_block]
    return max((held[c] for c in w.visited + ended_on), default=0), len(src)


def check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order,
                   lookahead=None):
    """Refuse settings that are unknown or that the chosen verifier cannot honour."""
    if lookahead is not None and (type(lookahead) is not int or lookahead < 0):
        raise ValueError(f"--lookahead must be an integer >= 0, got {lookahead!r}")
    if lookahead and verifier == "temporal":
        raise ValueError("--lookahead needs --verify copies: the temporal mask verifies one block")
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier (--verify) {verifier!r}; choose from "
                         f"{', '.join(VERIFIERS)}")
    if acceptance not in ACCEPTS:
        raise ValueError(f"unknown acceptance rule (--accept) {acceptance!r}; choose from "
                         f"{', '.join(ACCEPTS)}")
    if order not in ("tau", "position"):
        raise ValueError(f"order must be 'tau' or 'position', got {order!r}")
    if verifier == "temporal" and acceptance != "paper":
        raise ValueError(f"--verify temporal needs --accept paper (not {acceptance}): the temporal "
                         "mask gives no exact logits of the whole block at a drafted state")
    if verifier == "copies" and (not rope_copy or order != "tau"):
        raise ValueError("the rope-copy and order ablations apply to the temporal verifier only")
    if gamma is not None and gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    for name, x in (("gate", gate), ("draft_threshold", draft_threshold),
                    ("draft_stop", draft_stop)):
        if x is not None and not 0 < x <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {x}")


def simsd_round(tsess, dsess, rule, verifier, acceptance, gate, rope_copy, order, draft_kw,
                lookahead, stops, cost, generator):
    """SimSD's round for the loop, by verifier and acceptance rule: round_(front, room) ->
    (decode.Advance, drafts accepted, why the round ended; None on the temporal mask)."""
    temporal = verifier == "temporal"
    drafts = propose_drafts(dsess, rule, draft_kw, lookahead, stops, None if temporal else cost)
    if temporal:
        return temporal_round(tsess, drafts, rule, order, rope_copy, generator)
    if acceptance != "lossless":
        rules = dict(paper=accept_paper, gated=partial(accept_gated, gate=gate))
        return copies_round(tsess, drafts, rule, rules[acceptance], generator)
    walked = lossless_round(tsess, rule, lambda front, room: drafts(front, room).guesses(
        front.block, front.n_masked), generator)

    def round_(front, room):         # draft, verify as block copies, walk the target's own rule
        adv, g, w = walked(front, room)
        n, of = accepted(g, w)
        return adv, n, "every draft accepted" if n == of else "target chose otherwise"
    return round_


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, verifier="copies",
                   acceptance="lossless", gamma=None, gate=GATE, draft_threshold=DRAFT_THRESHOLD,
                   draft_stop=DRAFT_STOP, rope_copy=True, order="tau", fuse_commit=True,
                   eos_id=None, generator=None, on_block=None, lookahead=None, cost=None,
                   copy_commit=True):
    """SimSD decoding. target, drafter: Transformers sharing a tokenizer (batch 1). rule: the
    target's DecodeRule; the drafter samples with the same settings. verifier, acceptance: the
    module docstrings; gamma: most tokens drafted a round (default B x (1 + lookahead)); gate,
    draft_threshold, draft_stop: see accept_gated and draft. lookahead: blocks past the open
    one the drafter may draft (verifier "copies"; default LOOKAHEAD). cost: a cost model
    (costs.py) the drafts are sized by; None: every draft verified. copy_commit: a block
    finished ahead is committed from its copy (decode.Session.commit). rope_copy=False,
    order="position": the paper's ablations. generator: the target's stream; the drafter's is
    seeded from it (lossless: plain's tokens). -> (new ids, stats)."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order,
                   lookahead)
    if (drafter.config.mask_token_id, drafter.config.vocab_size) != (c.mask_token_id, c.vocab_size):
        raise ValueError("drafter and target differ in vocabulary size or mask token id")
    B, temporal = rule.block_size, verifier == "temporal"
    lookahead = (0 if temporal else LOOKAHEAD) if lookahead is None else lookahead
    gamma = B * (1 + lookahead) if gamma is None else gamma
    ids = check_prompt(prompt, c, max_new_tokens, target.embed.weight.device)
    t0, hist, ends, stops = time.perf_counter(), Counter(), Counter(), stop_ids(c, eos_id)
    scratch = (4 if temporal else gamma + lookahead + 4) * B
    tsess = Session(target, B, len(ids) + max_new_tokens + scratch, fuse_commit, copy_commit)
    dsess = Session(drafter, B, len(ids) + max_new_tokens + (lookahead + 3) * B, fuse_commit)
    seeded = None if generator is None else torch.Generator(generator.device).manual_seed(
        generator.initial_seed() + 1)
    draft_kw = dict(gamma=gamma, draft_threshold=draft_threshold, draft_stop=draft_stop,
                    generator=seeded)
    round_ = simsd_round(tsess, dsess, rule, verifier, acceptance, gate, rope_copy, order, draft_kw,
                         lookahead, stops, cost, generator)

    def tally(front, room):                          # why rounds end, and drafts accepted
        adv, n, why = round_(front, room)
        hist[n], ends[why] = hist[n] + 1, ends[why] + (why is not None)
        return adv

    out, stop = round_loop(tally, [tsess, dsess], ids, rule, max_new_tokens, stops, on_block)
    seconds, rounds = time.perf_counter() - t0, sum(hist.values())
    return out, dict(stop=stop, nfe=tsess.nfe, nfe_draft=dsess.nfe, rows=dict(tsess.rows),
                     rows_draft=dict(dsess.rows), tokens=len(out), seconds=seconds, rounds=rounds,
                     accept_hist=dict(sorted(hist.items())), lookahead=lookahead,
                     round_ends={k: v for k, v in ends.items() if v},
                     tokens_per_s=len(out) / seconds,
                     mean_accepted=sum(k * v for k, v in hist.items()) / max(rounds, 1))
