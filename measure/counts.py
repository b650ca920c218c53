"""What a run's rounds did, counted beside its tokens: the histograms bench.py, sample.py and
the tests read. A decoder given a Counts (counts=) reports each round to it; the decoders keep
no statistics of their own beyond their forwards (decode.round_loop's stats). The acceptance
ablations on copies (variants.on_copies) report drafts accepted and round ends only.

    out, stats = counting(spiffy_generate)(model, prompt, graph=graph)   # + the histograms
"""
from collections import Counter

from verify import lineage


class Counts:
    """Rounds counted by kind: ("steps", n) walked, ("copies", n) verified, ("accepted", k)
    drafts, ("end", why) the round ended, "blocks_ahead" finished past the open one, and per
    copy rank r the reach the cut saw summed, ("reach", r), and the rounds the walk visited
    that copy, ("walked", r) (reach_check); on the temporal mask, per draft rank, and the
    "drafts" proposed."""

    def __init__(self):
        self.n = Counter()

    def lossless(self, g, w):
        """A round of verify.lossless_round: Guesses g, Walk w. With g.drafted (SimSD's), the
        drafts accepted (the most any state the walk reached holds) and why the round ended.
        -> walked(g, w) where g has reach, else None."""
        self.n["steps", len(w.path)] += 1
        self.n["copies", len(g.n_masked) - 1] += 1
        self.n["blocks_ahead"] += len(w.crossed)
        seen = None if g.reach is None else walked(g, w)
        for r, visited in enumerate((seen or [])[1:], 1):
            self.n["reach", r] += g.reach[r]
            self.n["walked", r] += visited
        if g.drafted is not None:
            depth = lineage(g.after)[0] if g.after else [0] * len(g.n_masked)
            ended = [c for c, s in enumerate(w.copies) if s == w.host and depth[c] == len(w.crossed)]
            k, most = max(g.drafted[c] for c in [0, *w.visited, *ended]), max(g.drafted)
            self.ended(k, "nothing drafted" if not most else "every draft accepted" if k == most
                       else "target chose otherwise")
        return seen

    def temporal(self, d, k):
        """A round of speculate.temporal_round: Draft d, of which k drafts were accepted; per
        draft rank its reach and whether it was accepted (walked, for reach_check)."""
        for r, reach in enumerate(d.reach or [], 1):
            self.n["reach", r] += reach
            self.n["walked", r] += r <= k
        self.n["drafts"] += len(d.pos)
        self.ended(k, "nothing drafted" if not d.pos else "every draft accepted" if k == len(d.pos)
                   else "draft rejected")

    def ended(self, accepted, why):
        """A round that accepted `accepted` drafts and ended for reason `why`."""
        self.n["accepted", accepted] += 1
        self.n["end", why] += 1

    def hist(self, kind):
        """{n: rounds} of the (kind, n) entries."""
        return dict(sorted((k[1], v) for k, v in self.n.items() if type(k) is tuple and k[0] == kind))

    def summary(self):
        return dict(accept_hist=self.hist("accepted"), round_ends=self.hist("end"),
                    steps_per_forward=self.hist("steps"), nodes_per_forward=self.hist("copies"),
                    blocks_ahead=self.n["blocks_ahead"], reach_by_rank=self.hist("reach"),
                    walked_by_rank=self.hist("walked"), drafts=self.n["drafts"])


def walked(g, w):
    """Per copy of Guesses g, whether Walk w visited it; a next block's first copy (all masks)
    counts when its complete parent was visited: the walk enters it through that parent."""
    n, seen = len(g.n_masked), {0, *w.visited}
    after = g.after or [-1] * n
    return [c in seen or (after[c] in seen and g.n_masked[c] == g.copies.shape[1]) for c in range(n)]


def reach_check(reach, walked, least=20, within=1.5):
    """Summed reach against copies walked ({rank: total}, Counts' reach_by_rank and
    walked_by_rank), each rank with walked + reach >= least on its own, the others pooled as
    "rest" (checked when it has that mass). Why 20: a rank walked ~5 times is off by 1.5x by
    chance alone (Spiffy's ranks 4-8 at B = 32, 80 test problems against 160 training ones).
    -> (the ratio reach / walked farthest from 1, the groups beyond `within` either way); walked 0
    or reach 0 is infinitely far."""
    mass = {r: reach.get(r, 0) + walked.get(r, 0) for r in {*reach, *walked}}
    groups = {r: [r] for r in mass if mass[r] >= least}
    groups["rest"] = [r for r in mass if mass[r] < least]
    sums = {k: (sum(reach.get(r, 0) for r in rs), sum(walked.get(r, 0) for r in rs))
            for k, rs in groups.items()}
    ratios = {k: x / w if w else float("inf") for k, (x, w) in sums.items() if x + w >= least}
    far = lambda x: max(x, 1 / x) if x else float("inf")   # noqa: E731
    worst = max(ratios.values(), key=far, default=float("nan"))
    return worst, sorted((k for k, x in ratios.items() if far(x) > within), key=str)


def counting(decoder, counts=None):
    """decoder (spiffy.spiffy_generate, speculate.simsd_generate) with its rounds counted (by
    `counts`, else a Counts): the same call and output, its stats with the Counts' summary added."""
    def run(*args, **kw):
        c = counts or Counts()
        out, stats = decoder(*args, counts=c, **kw)
        return out, {**stats, **c.summary()}
    return run
