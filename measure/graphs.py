"""Spiffy's draft graphs as files: one per block size and decoding rule, next to the target's
weights, written by tools/calibrate.py (spiffy.calibrate on a set of prompts) and read by
load_graph; bench.py calibrates a missing one in memory (graphs_for)."""
import json
import time
from pathlib import Path

from spiffy import calibrate, graph_rule


def load_graph(path, rule):
    """Read a calibrated graph; refuse one made for another block size or decoding rule."""
    path = Path(path)
    if not path.is_file():
        command = calibrate_command(path.parent, rule)
        raise FileNotFoundError(f"draft graph {path} not found (run `{command}`, with --data "
                                "FILE.jsonl [--chat] to calibrate on your own prompts)")
    try:
        g = json.loads(path.read_text())
        g["nodes"] = [tuple(tuple(p) for p in n) for n in g["nodes"]]
        for n in g["nodes"]:
            ranks_ok = all(type(x) is int and x >= 0 for p in n for x in p)
            pairs = n and all(len(p) == 2 for p in n) and len({i for i, _ in n}) == len(n)
            if not pairs or not ranks_ok:
                raise ValueError(f"node {list(n)} is not a set of [position rank, token rank] "
                                 "pairs")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"malformed draft graph {path}: {e}") from None
    want = graph_rule(rule)
    got = {k: g.get(k) for k in want}
    if got != want:
        raise ValueError(f"draft graph {path} was calibrated for {got}, not {want}")
    return g


def calibrate_command(target_dir, rule):
    """The tools/calibrate.py command that writes the graph for `rule` next to target_dir's weights."""
    extra = {"low_confidence_static": "",
             "low_confidence_dynamic": f" --threshold {rule.threshold:g}",
             "entropy_bounded": f" --strategy entropy_bounded --eb-threshold {rule.eb_threshold:g}"}
    return (f"python tools/calibrate.py --target {target_dir} --block-size {rule.block_size}"
            + extra.get(rule.strategy, f" --strategy {rule.strategy}"))


def rule_kind(rule):
    """The rule in a file name: static, t0.9 (the threshold rule), eb0.5, or the strategy."""
    return {"low_confidence_static": "static", "low_confidence_dynamic": f"t{rule.threshold:g}",
            "entropy_bounded": f"eb{rule.eb_threshold:g}"}.get(rule.strategy, rule.strategy)


def graph_path(target_dir, rule):
    """Where the graph calibrated for `rule` lives: next to the target's weights."""
    return Path(target_dir) / f"spiffy_graph_b{rule.block_size}_{rule_kind(rule)}.json"


def graphs_for(target_dir, target, calib_prompts, note):
    """A graph per rule: the one shipped next to the target, else calibrated here on
    calib_prompts() (called once, when the first graph is missing)."""
    cache, prompts = {}, []

    def get(rule):
        key = (rule.block_size, rule.strategy)
        if key not in cache:
            path = graph_path(target_dir, rule)
            if path.is_file():
                cache[key] = load_graph(path, rule)
            else:
                t0 = time.perf_counter()
                prompts[:] = prompts or calib_prompts()
                cache[key] = calibrate(target, prompts, rule)
                note.append(f"calibrated a graph for {key} in {time.perf_counter() - t0:.1f} s "
                            f"({path.name} not found)")
        return cache[key]
    return get
