"""Reach tables: how far each proposer's reach (Guesses.reach, its guess that the walk visits
a copy) is from the copies the walk visits, per copy rank, for one method, block size and
rule; counted once with every copy verified on training-split problems (tools/reach.py) and
saved next to the target's weights (like Spiffy's graphs and the cost tables). The cut
(fast.cutter) reads the reach of copy rank r as min(1, scale[r - 1] * raw reach): raw reach
overstates the walk, most at B = 32 (docs/design.md), so the cut verified copies it then
never walked; Spiffy's default cut reads the scale as each request amends it
(measure.pricing.Learner.scale). The proposers keep their raw reach; the reference never reads a table.

The format, one JSON object a file:
    method      spiffy, simsd (a drafter's drafts), simsd-trajectory or simsd-lookup, each SimSD
                one on copies or, with -temporal, on the temporal mask (whose "copies" are
                its drafts, in draft order: walked is accepted)
    rule        spiffy.graph_rule's key and the temperature: a table is used only for them
    reach, walked   per copy rank 1, 2, ...: raw reach summed, and the rounds the walk visited
                it (a next block's first copy: when the walk visited its complete parent)
    rounds, steps, copies   the rounds counted, the steps they walked and the copies past the
                open block they verified, summed: a round's means, which fast.gated weighs
                before SimSD's drafter runs (on the temporal mask: the tokens a round reveals
                over the rule's tokens a step, its rule alone on the same problems; the drafts
                over block_size, the rows they add)
    scale       per rank, (walked + PRIOR x pooled) / (reach + PRIOR), pooled the ratio of all
                ranks' sums: a rank counted little borrows the pooled ratio (none proposed: [])
    problems, max_new_tokens, date, target: from what
"""
import json
from pathlib import Path

from measure.graphs import rule_kind
from spiffy import graph_rule

METHODS = ("spiffy", "simsd", "simsd-trajectory", "simsd-lookup", "simsd-temporal",
           "simsd-trajectory-temporal", "simsd-lookup-temporal")   # -temporal: --verify temporal


def rule_key(rule):
    return dict(graph_rule(rule), temperature=rule.temperature)


def method_of(spec, reference=None, verifier=None):
    """The table's method of a command line's spec (simsd, spiffy), SimSD's reference and
    verifier."""
    if spec != "simsd":
        return spec
    ref = "" if reference in (None, "drafter") else f"-{reference}"
    return f"simsd{ref}-temporal" if verifier == "temporal" else f"simsd{ref}"


def table_path(target_dir, method, rule):
    """Where the reach table for `method` and `rule` lives: next to the target's weights."""
    temp = "" if not rule.temperature else f"_T{rule.temperature:g}"
    return Path(target_dir) / f"reach_b{rule.block_size}_{method}_{rule_kind(rule)}{temp}.json"


PRIOR = 5   # reach a rank's own count weighs against the pooled ratio's (rounds' worth)


def scales(reach, walked):
    """Per rank, the scale that makes the summed reach the walked count, shrunk toward the
    ratio of all ranks pooled by PRIOR: a rank the walk rarely met (Spiffy's at B = 32: a few
    visits in 40 problems) borrows the method's overall ratio instead of its own noise."""
    pooled = (sum(walked) + 1) / (sum(reach) + 1)
    return [(w + PRIOR * pooled) / (r + PRIOR) for r, w in zip(reach, walked)]


def table(method, rule, reach, walked, **about):
    return dict(method=method, rule=rule_key(rule), reach=reach, walked=walked,
                scale=scales(reach, walked), **about)


def read(path, method, rule):
    """The table in `path`, refused (one line) when unreadable, or for another method or rule."""
    try:
        t = json.loads(Path(path).read_text())
        scale = t["scale"]
        if type(scale) is not list or not all(isinstance(s, (int, float)) and s >= 0 for s in scale):
            raise ValueError
    except OSError as e:
        raise ValueError(f"reach table {path} cannot be read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"malformed reach table {path}: it needs method, rule and scale "
                         "(a non-negative number per copy rank)") from None
    for k, want in (("method", method), ("rule", rule_key(rule))):
        if t.get(k) != want:
            raise ValueError(f"reach table {path} was counted for {k} {t.get(k)!r}, not {want!r}")
    return t


def load(path, method, rule):
    """The scale per rank in `path` (read's checks)."""
    return read(path, method, rule)["scale"]


def per_round(target_dir, method, rule):
    """(steps walked, copies past the open block verified) per round, the means in the reach
    table next to the weights (fast.gated's); None without a table or its rounds."""
    path = table_path(target_dir, method, rule)
    if not path.is_file():
        return None
    t = read(path, method, rule)                  # refused (one line) if for another method or rule
    return (t["steps"] / t["rounds"], t["copies"] / t["rounds"]) if t.get("rounds") else None


def find(target_dir, method, rule):
    """The scale per rank next to the weights, if counted. -> (scale or None, in words)."""
    path = table_path(target_dir, method, rule)
    if not path.is_file():
        return None, (f"raw reach (no {path.name}: python tools/reach.py --target {target_dir} "
                      f"--methods {method} --block-size {rule.block_size})")
    scale = load(path, method, rule)
    return scale, f"reach by {path.name}" if scale else f"raw reach ({path.name} saw no copy)"


def finder(target_dir, notes, alias=None):
    """-> scale_for(method, rule): find's scale per rank for a method of METHODS (alias: another
    name -> its method), else None; each table used or missing said once in `notes` (and
    scale_for.note(words): any other line, once)."""
    def note(words):   # a line of `notes`, once -> words
        if words not in notes:
            notes.append(words)
        return words

    def scale_for(method, rule):
        method = (alias or {}).get(method, method)
        scale, how = find(target_dir, method, rule) if method in METHODS else (None, None)
        if how:
            note(f"B={rule.block_size} {method}: {how}")
        return scale
    scale_for.target, scale_for.note = target_dir, note   # (bench.runner's)
    return scale_for
