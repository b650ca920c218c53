"""SimSD: speculative decoding of a block-diffusion LM with a small drafter dLLM.

docs/design.md, section 3 (after the SimSD paper). Per round, on the current block (a round of
the default path, "copies" with any acceptance rule, is simsd_round; of the paper's own path,
temporal_round):
  draft   the drafter runs its own decoding on the block's masked positions: each forward
          reveals its most confident position (and, with `draft_threshold`, every other one
          above it) until `gamma` tokens are drafted or its confidence falls below
          `draft_stop`. It records each drafted token d_i, its draft distribution p_draft(i)
          and its step label tau(i) (the step map).
  verify  ONE target forward, by one of two verifiers:
          "temporal" (the paper's): [data section | mask section] under the token-level
            temporal mask (mask.simsd_temporal); the slot of position i sees the block as it
            was just before step tau(i) and copies its RoPE position. 2B queries. Exact for a
            one-layer target only: deeper, a slot also sees slots of later steps, whose hidden
            states were built from data revealed after its step.
          "copies": the drafter's states X_t, X_t + d_1, X_t + d_1 + d_2, ... as whole-block
            copies (verify.verify_copies): the target's exact logits at every drafted state,
            the last one included. (n + 1) B queries.
  accept  along the draft order, by one of three rules:
          "paper" (accept; on the copies, accept_paper): greedy match, or min(1, p_target(d)
            / p_draft(d)); at the first rejection the correction from norm(max(0, p_target -
            p_draft)).
          "gated" (copies only, accept_gated): accept d only where the target is sure of that
            position in that exact state (it is its most confident masked position, or its
            confidence is above `gate`) and agrees as in "paper"; where it is not sure, the
            target takes its own decoding step (static or threshold) from that state and the
            round ends.
          "lossless" (copies only, accept_lossless): the target's own rule walked through the
            drafter's states (verify.walk, as in Spiffy): output identical to plain decoding,
            token for token in fp32 (bf16 rounding: see verify.py).
  commit  the accepted positions become known (any subset of the block, not only a left
          prefix); draft again until the block is full, then commit it to both caches.

Measured on the embedded pair (README): what loses answers at B = 8 and 32 is the ORDER the
drafter reveals positions in, not the temporal mask's approximation: "copies" with "paper"
loses as many as "temporal". "gated" keeps the target's answers; "lossless" on the threshold
rule keeps them exactly and is the fastest of the three (sample.py's default).

    python sample.py --spec simsd                  # on the embedded models
"""
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

import mask as masks
from decode import DecodeRule, Session, check_prompt, decode, packed_index, stop_ids, to_device, to_host
from verify import first_true, forward_cost, same_state, verify_copies, walk

VERIFIERS, ACCEPTS = ("temporal", "copies"), ("paper", "gated", "lossless")
DRAFT_THRESHOLD, DRAFT_STOP = 0.5, 0.3   # chosen by measurement on the embedded pair (README)
GATE = 0.9   # gated acceptance: the target confidence it accepts at
LOOKAHEAD = 3   # blocks the drafter drafts past the current one (docs/results.md: chosen by measurement)


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
            after = torch.arange(nb + 1, device=block.device)[:, None] > torch.arange(nb, device=block.device)
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
        return Draft(self.pos[:k], self.tokens[:k], self.p_draft[:k], self.tau[:k], per, self.mask_id)

    def sized(self, cost):
        """The prefix worth verifying (worth_verifying): the product of the drafter's
        probabilities of each draft's tokens as the chance its state is reached. A host sync."""
        chance = self.p_draft.gather(-1, self.tokens[:, None]).squeeze(-1).cumprod(0).tolist()
        return self.prefix(worth_verifying(chance, self.per_block or [len(self.pos)], cost))

    def tree(self, n_masked, B):
        """As verify_copies and walk take them, for states(): each copy's number of masks
        (n_masked: the block's), parent (None without lookahead); and src: the copy each draft
        was drafted in. Host ints only."""
        counts, parent, src = [], [], []
        for b, nb in enumerate(self.per_block or [len(self.pos)]):
            first = len(counts)
            counts += [(B if b else n_masked) - k for k in range(nb + 1)]
            parent += [first - 1 if b else -1] * (nb + 1)
            src += range(first, first + nb)
        return counts, parent if len(self.per_block or ()) > 1 else None, src


def worth_verifying(chance, per_block, cost):
    """How many drafts to verify: the prefix with the most expected steps a second, drafted
    state k reached with chance[k - 1] (one step for the block's own state), by the measured
    cost(n copies) of a forward (verify.forward_cost); a draft that ends a block brings the
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
    cost (verify.forward_cost): also stop once the newest drafts are past the prefix worth
    verifying (worth_verifying): they would be drafted for nothing, and later drafts, each
    less likely, pay less still."""
    B, block, rows, per_block, base, chance = rule.block_size, block.clone(), [], [0], None, []
    left = min(gamma, int((block == rule.mask_id).sum()) + lookahead * B)   # host sync
    while left > 0:
        masked = (block == rule.mask_id).nonzero().squeeze(-1)       # (m,): the rows read
        if not len(masked):                                          # drafted whole: on, ahead
            if len(per_block) > lookahead or stops and stops.intersection(block.tolist()):
                break
            base = sess.committed if base is None else base
            sess.commit(block)                                       # tentatively
            block, pos = torch.full_like(block, rule.mask_id), pos + B
            masked, _ = torch.arange(B, device=block.device), per_block.append(0)
        logits = sess.forward(block, pos, lambda c, k: masks.block_causal(B, c), keep=B, rows=masked)
        p = rule.probs(logits)                                       # (m, V)
        conf = rule.top_confidence(logits)
        conf, order = conf.sort(descending=True, stable=True)
        sure = 1 + int((conf[1:] > draft_threshold).sum()) if draft_threshold else 1  # host sync
        take = order[:min(sure, left)]
        tok = p[take].argmax(-1) if rule.temperature == 0 else \
            torch.multinomial(p[take], 1, generator=generator).squeeze(-1)
        block[masked[take]] = tok
        rows.append((masked[take] + B * (len(per_block) - 1), tok, p[take]))
        per_block[-1] += len(take)
        left -= len(take)
        if cost:                                                     # host sync
            last = chance[-1] if chance else 1.0
            chance += [last * c for c in p[take].gather(-1, tok[:, None]).squeeze(-1).cumprod(0).tolist()]
            if worth_verifying(chance, per_block, cost) < len(chance):
                break
        if draft_stop and len(take) < len(conf) and conf[len(take)] < draft_stop:  # host sync
            break
    if base is not None:                                             # roll the cache back
        sess.committed, sess.pending = base, None
    tau = torch.cat([torch.full_like(r[0], s + 1) for s, r in enumerate(rows)])
    return Draft(*(torch.cat(x) for x in zip(*rows)), tau, per_block, rule.mask_id)


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
    after_all = torch.full_like(undrafted, int(d.tau[-1]) + 1)  # undrafted: masks in every state
    step = torch.cat([zeros(known), d.tau, d.tau, after_all])
    is_slot = torch.cat([zeros(data_idx, dtype=torch.bool), torch.ones_like(slot_idx, dtype=torch.bool)])
    pad = 2 * len(block) - len(step)     # fixed length 2B: one compiled graph for every section
    step, is_slot = F.pad(step, (0, pad)), F.pad(is_slot, (0, pad))
    if rope_copy:
        slot_pos = pos[slot_idx]   # a slot takes the position of its data token
    else:                          # ablation: slots continue the sequence after the block
        slot_pos = pos[-1] + 1 + torch.arange(len(slot_idx), device=pos.device)
    return sess.forward(tokens, torch.cat([pos[data_idx], slot_pos]),
                        lambda c, n: masks.simsd_temporal(c, n, step, is_slot), keep=len(slot_idx))


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
    residual = p_target if rule.temperature == 0 else (p_target - p_draft).clamp(min=0)
    residual = residual if residual.sum() > 0 else p_target          # host sync
    if rule.temperature == 0:
        return residual.argmax()
    return torch.multinomial(residual / residual.sum(), 1, generator=generator)[0]


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
        tok, confidence, _ = rule.pick(logits[n:], generator)
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
    top = top.masked_fill(copies != rule.mask_id, -1.0)[to_device(src, copies.device)]  # known: never top
    return (top.argmax(-1) == d.pos % B) | (top[k, d.pos % B] > gate)


def ended_in(parent, c, step):
    """A round that ends in copy c (parent: Draft.tree's): the complete copies of the blocks it
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
    _, parent, src = d.tree(counts[0], copies.shape[1])
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
    _, parent, src = d.tree(counts[0], copies.shape[1])
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


def accept_lossless(logits, copies, counts, d, step, rule, generator=None):
    """The target's own decoding, walked through the drafter's states (verify.walk, as in
    Spiffy): it steps from copies[0] by its own rule, and while its new state is one of the
    drafted states, whose logits came with the forward, it steps again; a drafted block it
    finishes whole leads on into the next block's drafted states (lookahead). Every step is
    plain decoding's, so the blocks are plain decoding's token for token (with the same seed
    when sampling): the drafts only save forwards. A draft counts as accepted when the walk
    passed through a state holding it (it can skip some: a threshold step may reveal several
    drafts at once). -> as accept_paper."""
    _, parent, src = d.tree(counts[0], copies.shape[1])
    path, _, crossed = walk(logits, copies, counts, step, rule, generator, parent=parent)
    cut, block_of = dict(crossed), []                                # each transition's block
    for t in range(len(path)):
        block_of.append(cut.get(t, block_of[-1] if block_of else -1))
    walked = torch.stack([new for _, new in path])                   # (steps, B): the new states
    group, held = to_device([parent or [-1] * len(copies), [sum(s < c for s in src)
                                                              for c in range(len(copies))]], copies.device)
    reached = (same_state(copies[None], walked[:, None])
               & (group[None] == to_device(block_of, copies.device)[:, None])).any(0)  # (m,)
    accepted = int(torch.where(reached, held, 0).max())              # host sync; 0: none reached
    why = "every draft accepted" if accepted == len(src) else "target chose otherwise"
    steps = len(path) - (crossed[-1][0] if crossed else 0)
    return path[-1][1], accepted, steps, why, [j for _, j in crossed]


def simsd_round(tsess, dsess, block, pos, n_masked, step, rule, accept_drafts, draft_kw, generator=None,
                lookahead=0, stops=(), cost=None):
    """One round of SimSD's default path, verifier "copies" (in the spirit of gpt-fast's
    speculative_decode): the drafter drafts, the target checks every drafted state in ONE
    forward, the acceptance rule keeps what it accepts, and the new block holds it.
    block: the current block, n_masked of its positions masked (a host int); step: the
    target's step index at it; accept_drafts: accept_lossless, accept_gated or accept_paper;
    draft_kw: draft's settings (gamma, draft_threshold, draft_stop, the drafter's generator);
    lookahead: how many later blocks the drafter may draft into (see draft); cost: verify only
    the drafts that pay for themselves (Draft.sized), None: all.
    -> (new block, drafts accepted, target steps taken in the new block's block, why the round
    ended, the blocks it finished on the way (lookahead), in order)."""
    # draft: the drafter decodes the block its own way, up to gamma tokens (and on, ahead)
    d = draft(dsess, block, pos, rule, **draft_kw, lookahead=lookahead, stops=stops, cost=cost)
    d = d.sized(cost) if cost else d
    # verify: the block before each draft and after the last as whole-block copies (copy k:
    # drafts 1..k revealed, n_masked - k masks left; with lookahead, then the next block's
    # states after the drafted block), in ONE target forward: the target's exact logits in
    # every state the drafter passed through
    copies = d.states(block)
    counts, parent, _ = d.tree(n_masked, rule.block_size)
    logits = verify_copies(tsess, copies, pos, counts, rule.mask_id, parent)
    # accept and commit: the accepted drafts, and the target's own step or correction after
    # them, make the new block; the next round drafts from it
    block, accepted, steps, why, crossed = accept_drafts(logits, copies, counts, d, step, rule, generator)
    tsess.keep(*crossed)                                             # (with copy_commit)
    return block, accepted, steps, why, [copies[j] for j in crossed]


def temporal_round(tsess, dsess, block, pos, rule, draft_kw, order="tau", rope_copy=True, generator=None):
    """One round of the paper's own path (verifier "temporal"): draft, ONE target forward over
    [data section | mask section] (verify_temporal), the paper's rule along the step map
    (accept_temporal).
    order="position", rope_copy=False: the paper's ablations. -> (new block, drafts accepted)."""
    d = draft(dsess, block, pos, rule, **draft_kw)
    if order == "position":                                          # ablation: left to right
        d = Draft(*(t[d.pos.argsort()] for t in (d.pos, d.tokens, d.p_draft)),
                  torch.arange(1, len(d.pos) + 1, device=d.pos.device))
    logits = verify_temporal(tsess, block, pos, d, rule, rope_copy)
    return accept_temporal(logits, block, d, rule, generator)


def check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order,
                   lookahead=None):
    """Refuse settings that are unknown or that the chosen verifier cannot honour."""
    if lookahead is not None and (type(lookahead) is not int or lookahead < 0):
        raise ValueError(f"--lookahead must be an integer >= 0, got {lookahead!r}")
    if lookahead and verifier == "temporal":
        raise ValueError("--lookahead needs --verify copies: the temporal mask verifies one block")
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier (--verify) {verifier!r}; choose from {', '.join(VERIFIERS)}")
    if acceptance not in ACCEPTS:
        raise ValueError(f"unknown acceptance rule (--accept) {acceptance!r}; choose from {', '.join(ACCEPTS)}")
    if order not in ("tau", "position"):
        raise ValueError(f"order must be 'tau' or 'position', got {order!r}")
    if verifier == "temporal" and acceptance != "paper":
        raise ValueError(f"--accept {acceptance} needs --verify copies: the temporal mask gives no "
                         "exact logits of the whole block at a drafted state")
    if verifier == "copies" and (not rope_copy or order != "tau"):
        raise ValueError("the rope-copy and order ablations apply to the temporal verifier only")
    if gamma is not None and gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    for name, x in (("gate", gate), ("draft_threshold", draft_threshold), ("draft_stop", draft_stop)):
        if x is not None and not 0 < x <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {x}")


@torch.no_grad()
def simsd_generate(target, drafter, prompt, max_new_tokens=64, rule=None, verifier="copies",
                   acceptance="lossless", gamma=None, gate=GATE, draft_threshold=DRAFT_THRESHOLD,
                   draft_stop=DRAFT_STOP, rope_copy=True, order="tau", fuse_commit=True, eos_id=None,
                   generator=None, on_block=None, lookahead=None, cost_sized=True, copy_commit=True):
    """SimSD decoding. target, drafter: Transformers sharing a tokenizer (batch 1). rule: the
    target's DecodeRule; the drafter samples with the same settings. verifier, acceptance: see
    the module docstring; gamma: most tokens drafted a round (default B, and B more a lookahead
    block); gate, draft_threshold, draft_stop: see accept_gated and draft. lookahead: blocks
    past the current one the drafter may draft (verifier "copies"; default LOOKAHEAD): a round
    that finishes its block goes on into the next, in the same target forward (never past
    max_new_tokens). cost_sized: verify only the drafts that pay for themselves by this device's
    forward cost (Draft.sized). copy_commit: a block finished ahead is committed from its copy
    (decode.Session.keep). rope_copy=False, order="position": the paper's ablations. generator:
    the target's stream; the drafter's is seeded from it (lossless: plain's tokens)."""
    c = target.config
    rule = rule or DecodeRule(c.mask_token_id, c.block_size)
    check_settings(verifier, acceptance, gamma, gate, draft_threshold, draft_stop, rope_copy, order, lookahead)
    if drafter.config.mask_token_id != c.mask_token_id or drafter.config.vocab_size != c.vocab_size:
        raise ValueError("drafter and target differ in vocabulary size or mask token id")
    B, lookahead = rule.block_size, (LOOKAHEAD if verifier == "copies" else 0) if lookahead is None else lookahead
    gamma = B * (1 + lookahead) if gamma is None else gamma
    ids = check_prompt(prompt, c, max_new_tokens, target.embed.weight.device)
    t0, hist, ends, stops = time.perf_counter(), Counter(), Counter(), stop_ids(c, eos_id)  # ends: why rounds end
    scratch = (gamma + lookahead + 4) * B if verifier == "copies" else 4 * B
    cost = forward_cost(target, B) if cost_sized and verifier == "copies" else None
    tsess = Session(target, B, len(ids) + max_new_tokens + scratch, fuse_commit, copy_commit)
    dsess = Session(drafter, B, len(ids) + max_new_tokens + (lookahead + 3) * B, fuse_commit)
    draft_kw = dict(gamma=gamma, draft_threshold=draft_threshold, draft_stop=draft_stop, generator=None if generator
                    is None else torch.Generator(generator.device).manual_seed(generator.initial_seed() + 1))
    accept_drafts = dict(paper=accept_paper, gated=partial(accept_gated, gate=gate), lossless=accept_lossless)[acceptance]
    ahead = []   # (block, step): blocks a round finished past its own, then the one it ended in

    def fill_block(block, pos, n_masked, room):
        step = 0
        if ahead:                                                    # reached by an earlier round
            block, step = ahead.pop(0)
            n_masked = int((block == rule.mask_id).sum())                # host sync
        while n_masked:
            if verifier == "temporal":
                block, n_accepted = temporal_round(tsess, dsess, block, pos, rule, draft_kw, order,
                                                   rope_copy, generator)
            else:                                                        # no block past max_new_tokens
                block, n_accepted, n_steps, why, finished = simsd_round(
                    tsess, dsess, block, pos, n_masked, step, rule, accept_drafts, draft_kw, generator,
                    min(lookahead, max(0, -(-room // B))), stops, cost)
                step = n_steps if finished else step + n_steps
                if finished:                                             # the first is this block
                    ahead.extend([(f, 0) for f in finished[1:]] + [(block, step)])
                    block = finished[0]
                ends[why] += 1
            hist[n_accepted] += 1
            n_masked = int((block == rule.mask_id).sum())                # host sync
        return block, to_host(block)[0]

    out, stop = decode(fill_block, [tsess, dsess], ids, B, max_new_tokens, rule.mask_id, stops, on_block)
    seconds, rounds = time.perf_counter() - t0, sum(hist.values())
    return out, dict(stop=stop, nfe=tsess.nfe, nfe_draft=dsess.nfe, rows=dict(tsess.rows), rows_draft=dict(
        dsess.rows), tokens=len(out), seconds=seconds, rounds=rounds, accept_hist=dict(sorted(hist.items())),
        lookahead=lookahead, round_ends=dict(ends), tokens_per_s=len(out) / seconds,
        mean_accepted=sum(k * v for k, v in hist.items()) / max(rounds, 1))
