"""Reach that means what the walk does: the cut's reach (a reach table's scale on the raw
reach, measure/reach.py) summed per copy rank stays within 1.5x of the copies the walk
visited, on test-split problems the tables were not counted on; an overstated reach fails."""
import importlib.util
import json
import shlex
import subprocess
import sys

import pytest
import torch

import cli
import fast
import verify
from measure import costs, reach
from measure.counts import counting, reach_check
from measure.graphs import graph_path, load_graph
from spiffy import spiffy_generate
from training.tasks import problems
from variants import simsd
from verify import Guesses

from conftest import ROOT

TARGET = ROOT / "models" / "target"
PROBLEMS = 80   # Spiffy at B = 32 walks few copies; the others, an eighth of them
SHIPPED_COSTS = "cost_b{}_float32_cpu-amd-epyc-2-threads.json"   # the same table on any machine


def test_the_check_passes_within_its_bound_and_fails_beyond_it():
    walked = {1: 20, 2: 10, 3: 2}   # (mass 10 enough here: least=10)
    assert reach_check({1: 25.0, 2: 7.0, 3: 7.0}, walked, 10) == (0.7, [])   # rank 3: too little mass
    assert reach_check({1: 31.0, 2: 10.0, 3: 0.1}, walked, 10)[1] == [1]     # 1.55x over
    assert reach_check({1: 12.0, 2: 10.0}, walked, 10)[1] == [1]             # 1.67x under
    assert reach_check({1: 10.0}, {}, 10)[1] == [1]                          # reached, never walked
    pooled = reach_check({1: 20.0, 2: 10.0, 3: 6.0, 4: 6.0}, {**walked, 4: 1}, 10)
    assert pooled == (4.0, ["rest"])                                     # 3 and 4: 12 against 3
    assert reach_check({}, {}) != reach_check({}, {})                     # nan: nothing to check


def test_the_scale_is_applied_per_rank_and_capped_at_one():
    g = Guesses(torch.zeros(4, 4, dtype=torch.long), [4, 3, 2, 1], None, [1.0, 0.8, 0.5, 0.4])
    assert fast.calibrated(g, [0.5, 3.0]).reach == [1.0, 0.4, 1.0, 1.0]   # past the table: the last
    assert fast.calibrated(g, None) is g
    cut = fast.cutter(None, None, 4, [0.5])
    assert cut(g).reach == [1.0, 0.4, 0.25, 0.2] and fast.cutter(None, None, 4) is None


def test_the_tool_writes_a_table_the_reader_takes_and_refuses_for_another_rule(tmp_path):
    script = ROOT / "tools" / "reach.py"
    spec = importlib.util.spec_from_file_location("reach_tool", script)   # not measure.reach
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    done = subprocess.run([sys.executable, str(script), *shlex.split(tool.SMOKE), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    model = cli.load(TARGET)[0]
    rule = cli.make_rule(model, 4, cli.THRESHOLD)
    path = reach.table_path(tmp_path, "spiffy", rule)
    t = json.loads(path.read_text())
    assert t["problems"].startswith("train") and len(t["scale"]) == len(t["walked"]) >= 1
    assert reach.load(path, "spiffy", rule) == t["scale"]
    with pytest.raises(ValueError, match="was counted for rule"):
        reach.load(path, "spiffy", cli.make_rule(model, 4, 0.8))
    with pytest.raises(ValueError, match="was counted for method"):
        reach.load(path, "simsd", rule)
    sampled = subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--temperature", "0.8",
                              "--block-size", "4", "--methods", "simsd-trajectory", "--problems", "2",
                              "--max-new-tokens", "24"],
                             capture_output=True, text=True, timeout=300)
    assert sampled.returncode == 0, sampled.stderr
    hot = cli.make_rule(model, 4, cli.THRESHOLD, 0.8)   # its own file, read only for its temperature
    assert reach.table_path(tmp_path, "simsd-trajectory", hot).name == "reach_b4_simsd-trajectory_t0.9_T0.8.json"
    path = reach.table_path(tmp_path, "simsd-trajectory", hot)
    t = json.loads(path.read_text())   # (2 sampled problems may propose no copy: scale [], read as raw reach)
    assert t["rule"]["temperature"] == 0.8 and reach.load(path, "simsd-trajectory", hot) == t["scale"]
    with pytest.raises(ValueError, match="was counted for rule"):
        reach.load(path, "simsd-trajectory", rule)


@pytest.fixture(scope="module")
def embedded():
    target, tok, drafter = cli.load_models(TARGET, cli.DEFAULT_DRAFTER, (4, 32))
    prompts = [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(PROBLEMS, "test")]
    return target, drafter, prompts


def overstated(g, times):
    """Guesses g with every copy's reach but the open block's `times` as high."""
    return Guesses(g.copies, g.n_masked, g.after, g.reach[:1] + [times * x for x in g.reach[1:]],
                   g.drafted)


def by_rank(method, B, embedded, table="shipped", times=1):
    """The cut's reach and the copies walked per rank, summed: `method` at B on the test
    problems, sized by the shipped cost table (table None: every copy verified), its reach by
    the shipped reach table (and then made `times` as high: planted)."""
    target, drafter, prompts = embedded
    rule = cli.make_rule(target, B, cli.THRESHOLD)
    cost = table and costs.cost_of(costs.read_table(TARGET / SHIPPED_COSTS.format(B)))
    scale = reach.load(reach.table_path(TARGET, method, rule), method, rule)
    cut = lambda g: (lambda g: fast.sized(g, cost) if cost else g)(   # noqa: E731
        overstated(fast.calibrated(g, scale), times))
    got, walked = {}, {}
    for ids in prompts[:PROBLEMS if method == "spiffy" and B == 32 else PROBLEMS // 8]:
        if method == "spiffy":
            g = load_graph(graph_path(TARGET, rule), rule)
            _, st = counting(spiffy_generate)(target, ids, 64, rule, graph=g, walk=verify.walk_one_sync, cut=cut)
        else:
            _, st = simsd(target, drafter, ids, 64, rule, draft=fast.draft_one_sync, walk=verify.walk_one_sync, cut=cut)
        for r, x in st["reach_by_rank"].items():
            got[r] = got.get(r, 0.0) + x
        for r, x in st["walked_by_rank"].items():
            walked[r] = walked.get(r, 0) + x
    return got, walked


@pytest.mark.parametrize("method, B", [("spiffy", 4), ("spiffy", 32), ("simsd", 4), ("simsd", 32)])
def test_the_cuts_reach_is_what_the_walk_visits_and_an_overstated_one_fails(method, B, embedded):
    """Within 1.5x on every rank with mass (walked + reach >= 20; the rest pooled), with every
    copy verified (the tables' own condition, on other problems: there is mass to check) and
    sized by the shipped cost table (at B = 32 Spiffy's cut then verifies no copy: nothing to
    check); the same reach planted 3x too high fails on some rank."""
    for table in (None, "shipped"):
        got, walked = by_rank(method, B, embedded, table)
        worst, off = reach_check(got, walked)
        assert off == [] and (table or worst == worst), (table, worst, got, walked)   # nan: no mass
    worst, off = reach_check(*by_rank(method, B, embedded, None, times=3))
    assert off != [] and worst > 1.5, (worst, off)
