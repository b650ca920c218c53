"""SimSD's drafts: what a round verifies (Draft), and two sources of one that need no drafter.

The SimSD paper takes its reference tokens "either from a smaller draft model, or from
previously decoded trajectories". speculate.draft is the first; here are two of the second kind,
proposers for SimSD's rounds ((front, room) -> Draft), which run no forward of their own:
  trajectory  the target's own last forward: at the open block's state, its most likely token
              at every masked position, revealed in its own confidence order (the threshold
              rule's first step at once, then one a step): the trajectory it would follow if
              its current guesses held. Read off the ranks the last walk brought back
              (Frontier.hint); a state no forward has seen (a new block) proposes nothing.
  lookup      prompt-lookup decoding's n-gram match: the most recent earlier occurrence, in the
              prompt and the text decoded so far (Frontier.context), of the last n tokens
              before the open block's first mask (n = lookup_n, 3), and the tokens
              that followed it, on into up to `lookahead` later blocks. No match: nothing
              proposed, and the round is a plain step.
Both propose fixed tokens, a point proposal: p_draft is one-hot where the paper's acceptance
reads it (speculative sampling then accepts d with p_target(d), and corrects from p_target
without d), None on the lossless walk, which never reads it. How many drafts a forward
verifies: Draft.sized by a cost table, with `chance`, the source's own guess of each draft's
odds: trajectory the product of the target's last confidences, lookup LOOKUP_CHANCE.
"""
import bisect
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from decode import to_device
from verify import Guesses

LOOKUP_N = 3          # the longest n-gram lookup matches (docs/results.md: by measurement)
LOOKUP_MIN_N = 3      # the shortest
LOOKUP_CHANCE = (0.3, 0.85)   # lookup's guess that its first token is kept, and each next one
                              # after it (sizing only; docs/lookup_keep.py: 0.12-0.57, 0.4-0.93)
INSIDE_STEP = 0.03    # a state inside one of the drafter's steps against one at a step's end:
                      # how often the walk goes on from it (sizing only; docs/visits.py, training
                      # problems: 1-2% of the times against 15-64%; the target's own threshold
                      # step reveals what the drafter's did at once, and jumps over it)
REFERENCES = ("drafter", "trajectory", "lookup")


@dataclass
class Draft:
    pos: torch.Tensor       # (n,) positions drafted this round, in draft order; B and on: a
                            # later block's (lookahead), position p at p % B of block p // B
    tokens: torch.Tensor    # (n,) drafted tokens d_i
    p_draft: torch.Tensor   # (n, V) the drafter's distribution at the step each was revealed
                            # (a drafter-free source's point proposal: one-hot, or None)
    tau: torch.Tensor       # (n,) step labels 1, 2, ... (the step map; equal within a step)
    per_block: list = None  # host ints: drafts in the block, then in each later block (lookahead)
    mask_id: int = None     # (a later block's states start from all masks)
    chance: list = None     # host floats: the chance each draft's state is reached (sized());
                            # None: the product of the drafter's probabilities of its tokens
    proposed: int = None    # drafts proposed before a cost table cut them (None: len(pos))
    step_end: list = None   # host bools: the draft is the last of its drafter step (None: each is)
    keep: list = None       # host ints: the drafts whose states are verified (None: every one)

    def states(self, block):
        """(m, B): the block before each draft and after the last (cumulative reveals); with
        lookahead, then each later block's, from all masks, after the block before it drafted
        whole (complete). Built at once: which copy holds which draft is known on the host."""
        B, per = len(block), self.per_block or [len(self.pos)]
        copy, draft, first, at = [], [], 0, 0   # host: copy c holds draft i, for each such pair
        for nb in per:
            for j in range(nb):                 # draft at + j: in the block's copies after it
                copy += range(first + j + 1, first + nb + 1)
                draft += [at + j] * (nb - j)
            first, at = first + nb + 1, at + nb
        states = block.repeat(first, 1)
        if len(per) > 1:
            states[per[0] + 1:] = self.mask_id  # later blocks' copies start from all masks
        copy, draft = to_device([copy, draft], block.device)
        states[copy, self.pos[draft] % B] = self.tokens[draft]
        return states if self.keep is None else states[self.kept_copies()]

    def kept_copies(self):
        """Which of states()'s copies are verified: each block's state before its first draft,
        and the state after each kept draft. Host ints, rising."""
        keep = set(range(len(self.pos)) if self.keep is None else self.keep)
        out, at, base = [], 0, 0
        for nb in self.per_block or [len(self.pos)]:
            out += [base] + [base + j + 1 for j in range(nb) if at + j in keep]
            at, base = at + nb, base + nb + 1
        return out

    def prefix(self, k):
        """The first k drafts (the blocks they reach; one ending a block keeps the next one's
        first state)."""
        per, left = [], k
        for nb in self.per_block or [len(self.pos)]:
            per.append(min(nb, left))
            left -= per[-1]
            if per[-1] < nb:
                break
        return replace(self, pos=self.pos[:k], tokens=self.tokens[:k], p_draft=None if
                       self.p_draft is None else self.p_draft[:k], tau=self.tau[:k], per_block=per,
                       chance=self.chance and self.chance[:k], step_end=self.step_end and
                       self.step_end[:k], keep=None,
                       proposed=len(self.pos) if self.proposed is None else self.proposed)

    def sized(self, cost):
        """The drafts worth verifying (worth_verifying), each weighed by `chance`, or else the
        product of the drafter's probabilities of its tokens (a host sync), and by whether the
        drafter's step ended there (weighed)."""
        chance = self.chance or self.p_draft.gather(-1, self.tokens[:, None]).squeeze(-1).cumprod(
            0).tolist()
        keep = worth_verifying(weighed(chance, self.step_end), self.per_block or [len(self.pos)],
                               cost)
        d = self.prefix(keep[-1] + 1 if keep else 0)
        return d if len(keep) == len(d.pos) else replace(d, keep=keep)

    def layout(self, n_masked, B):
        """For states(): each copy's number of masks (n_masked: the open block's), its parent
        (verify.Guesses'; None without lookahead); and src: for each draft, the copy before the
        first one holding it. Host ints only."""
        counts, parent, full = [], [], []            # every copy's; full: each draft's own copy
        for b, nb in enumerate(self.per_block or [len(self.pos)]):
            first = len(counts)
            counts += [(B if b else n_masked) - k for k in range(nb + 1)]
            parent += [first - 1 if b else -1] * (nb + 1)
            full += range(first + 1, first + nb + 1)
        kept = self.kept_copies()
        new = {c: i for i, c in enumerate(kept)}
        counts = [counts[c] for c in kept]     # (a later block's copy needs its parent: KeyError)
        parent = [new[parent[c]] if parent[c] >= 0 else -1 for c in kept]
        src = [bisect.bisect_left(kept, c) - 1 for c in full]
        return counts, parent if len(self.per_block or ()) > 1 else None, src

    def cut_at(self, block, b, state):
        """Whether `state` (a host list) is a drafted state of the b-th block this draft reaches
        (from the open `block`) that a cost table left out (keep): a walk that ends there ended
        for want of its copy, not where the target chose otherwise."""
        per = self.per_block or [len(self.pos)]
        if self.keep is None or b >= len(per):
            return False
        base, every = sum(n + 1 for n in per[:b]), replace(self, keep=None).states(block).tolist()
        cut = set(range(base, base + per[b] + 1)) - set(self.kept_copies())
        return any(every[c] == state for c in cut)

    def guesses(self, block, n_masked):
        """The drafted states of the open `block` (n_masked of it masked) as verify.Guesses."""
        if not len(self.tau):                                    # nothing drafted
            return Guesses(block[None], [n_masked], None, self)
        counts, parent, _ = self.layout(n_masked, len(block))
        return Guesses(self.states(block), counts, parent, self)


def weighed(chance, step_end=None):
    """Each draft's worth as a verified state, in expected steps the walk takes from it: the
    chance its state is reached, times INSIDE_STEP where the drafter's own step went on past it
    (the target's step, like the drafter's, reveals several tokens at once). Host floats."""
    return [c if step_end is None or step_end[i] else c * INSIDE_STEP for i, c in enumerate(chance)]


def worth_verifying(value, per_block, cost):
    """Which drafts to verify: the set with the most expected steps a second, a draft's state
    worth value[i] steps (one for the block's own state), by the measured cost(n copies) of a
    forward (a cost table, costs.py). For each count the most valuable drafts are the best
    (ties: the earlier, so a block's end comes before the blocks it leads to), and a draft
    that ends a block brings the next block's first copy with it. -> their indices, rising.
    Host floats and ints."""
    ends = {sum(per_block[:b + 1]) - 1 for b in range(len(per_block) - 1)}   # drafts ending a block
    order = sorted(range(len(value)), key=lambda i: (-value[i], i))
    total, copies, best = 1.0, 1, (1.0 / cost(1), 0)
    for n, i in enumerate(order, 1):
        total, copies = total + value[i], copies + 1 + (i in ends)
        best = max(best, (total / cost(copies), n))
    return sorted(order[:best[1]])


def point(d, vocab):
    """d with one-hot p_draft (a point proposal), as the paper's acceptance reads it."""
    d.p_draft = F.one_hot(d.tokens, vocab).float()
    return d


def make(pos, tokens, tau, per_block, chance, mask_id, device, step_end=None):
    """A Draft from host lists (an empty one: nothing proposed, a plain step)."""
    pos, tokens, tau = (to_device(x, device) for x in (pos, tokens, tau))
    return Draft(pos, tokens, None, tau, per_block, mask_id, chance, step_end=step_end)


def trajectory(front, rule, ahead, stops):
    """The target's trajectory from the open block's state, read off front.hint (the ranks of
    the last forward at this state: positions by confidence, each one's best token and its
    probability; verify.walk's `extra`, spiffy.ranks). ahead: a block drafted whole brings
    the next block's first state (all masks) as one more copy, unless it holds a stop id.
    -> Draft."""
    if not front.hint:                                       # no forward has seen this state
        return make([], [], [], [0], [], rule.mask_id, front.block.device)
    order, tok, p = front.hint
    m = front.n_masked
    first = sum(p[i][0] > rule.threshold for i in range(m)) if rule.strategy == \
        "low_confidence_dynamic" else 1                      # the threshold rule's first step
    tau = [max(1, i + 2 - max(first, 1)) for i in range(m)]           # (the first `first` at once)
    chance, c, block = [], 1.0, list(front.host)
    for i in range(m):
        c *= p[i][0]
        chance.append(c)
        block[order[i]] = tok[i][0]
    cross = int(ahead > 0 and not stops.intersection(block))
    return make(order[:m], [tok[i][0] for i in range(m)], tau, [m] + [0] * cross, chance,
                rule.mask_id, front.block.device, [i + 1 >= first for i in range(m)])


def lookup(context, n, want):
    """Prompt lookup: the (at most `want`) tokens that followed the most recent earlier
    occurrence of context's last n tokens; [] if they never occurred before."""
    key = context[len(context) - n:]
    for s in range(len(context) - n - 1, -1, -1) if len(context) > n else ():
        if context[s:s + n] == key:
            return context[s + n:s + n + want]
    return []


def lookup_draft(front, rule, n, ahead, stops, hinted=True):
    """The lookup proposal for the open block, then up to `ahead` later blocks: the tokens
    that followed the last match of the n tokens before the block's first mask, position by
    position, up to a known position that holds another token, or past a block that holds a
    stop id. The open block's drafts in the order of the last forward's confidence
    (front.hint, when hinted and there is one), else left to right. -> Draft."""
    B, mask = rule.block_size, rule.mask_id
    state = front.host
    lead = next((i for i, t in enumerate(state) if t == mask), B)
    guess = lookup(list(front.context) + state[:lead], n, B - lead + ahead * B)
    full, pos, per_block = state[:lead], [], [0]
    for p, t in enumerate(guess, lead):
        if p < B and state[p] != mask and state[p] != t:     # the match broke
            break
        if p % B == 0 and p:                                 # on into the next block
            if stops.intersection(full[p - B:p]):
                break
            per_block.append(0)
        full.append(t)
        if p >= B or state[p] == mask:
            pos.append(p)
            per_block[-1] += 1
    done = len(full) % B == 0 and len(full) // B < ahead + 1
    if done and per_block[-1] and not stops.intersection(full[-B:]):
        per_block.append(0)                                  # the next block's first state
    if hinted and front.hint and per_block[0]:              # the open block by confidence
        rank = {q: r for r, q in enumerate(front.hint[0])}
        pos[:per_block[0]] = sorted(pos[:per_block[0]], key=rank.get)
    tokens = [full[p] for p in pos]
    chance = [LOOKUP_CHANCE[0] * LOOKUP_CHANCE[1] ** i for i in range(len(pos))]
    return make(pos, tokens, list(range(1, len(pos) + 1)), per_block, chance, mask,
                front.block.device)
