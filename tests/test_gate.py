"""SimSD's drafter runs only in rounds where it is expected to pay (fast.gated), decided before
it runs, from the cost table's drafting (a drafter step timed whole by tools/costs.py
--drafter) and a reach table's means a round (steps walked, copies verified). Priced dear, no
round drafts and SimSD is the rule alone; free, every round drafts as without the gate; in
between, the drafter skips rounds and its cache catches up: its drafts are those of a drafter
that saw every block, and the tokens are plain decoding's in every case."""
import json

import pytest
import torch

import cli
import fast
import verify
from decode import Frontier, Session, generate
from speculate import Settings
from loading import checkpoint
from measure import costs, reach
from measure.pricing import price
from tools import costs as costs_script
from variants import simsd
from conftest import ROOT, make_model

PROMPTS = ("Question: Tom has 7 apples and buys 5 more. How many apples does Tom have?\nAnswer:",
           "Question: A box holds 12 pens. 4 are taken out. How many pens are left?\nAnswer:")


@pytest.fixture(scope="module")
def pair():
    target, tok, drafter = cli.load_models(cli.DEFAULT_TARGET, cli.DEFAULT_DRAFTER, (4,))
    return target, drafter, [tok.encode(p) for p in PROMPTS], cli.make_rule(target, 4, cli.THRESHOLD)


def flat_cost(seconds=1e-3):
    return costs.cost_of(dict(block_size=4, rows=[4, 64], seconds=[seconds, seconds]))


def run(pair, draft, n=48, **settings):
    target, drafter, prompts, rule = pair
    return [simsd(target, drafter, ids, n, rule, draft=draft, walk=verify.walk_one_sync, **settings)
            for ids in prompts]


def test_dear_drafting_never_runs_the_drafter_and_decodes_as_the_rule(pair):
    target, _, prompts, rule = pair
    gate = fast.gated(fast.draft_one_sync, flat_cost(), dict(step_s=[1.0] * 4), (3.0, 5.0))    # a second a step
    for ids, (out, st) in zip(prompts, run(pair, gate)):
        plain, pst = generate(target, ids, 48, rule)
        assert out == plain and st["nfe"] == pst["nfe"]
        assert st["round_ends"] == {"nothing drafted": st["nfe"] - 1}   # (the prefill's forward)
        assert st["nfe_draft"] <= 1                                      # the drafter's prefill


def test_free_drafting_drafts_every_round_as_without_the_gate(pair):
    gate = fast.gated(fast.draft_one_sync, flat_cost(), dict(step_s=[1e-12] * 4), (3.0, 5.0))
    for (out, st), (ref, rst) in zip(run(pair, gate), run(pair, fast.draft_one_sync)):
        assert out == ref and (st["nfe"], st["nfe_draft"]) == (rst["nfe"], rst["nfe_draft"])
        assert "nothing drafted" not in st["round_ends"] and st["nfe_draft"] > 1


def test_without_its_costs_the_gate_is_the_drafter_itself():
    assert fast.gated(fast.draft_one_sync, flat_cost(), None, (3.0, 5.0)) is fast.draft_one_sync
    assert fast.gated(fast.draft_one_sync, flat_cost(), dict(step_s=[1.0]), None) is fast.draft_one_sync


def test_a_drafter_that_skips_rounds_catches_up_and_drafts_as_one_that_saw_every_block(pair):
    """With no block ahead a round drafts k = min(3, masks left) steps; priced by the step, only
    a round with one mask left drafts. Each draft is drafted again by a fresh drafter prefilled
    with the same context in one go: the same tokens (the skipped blocks reached its cache)."""
    target, drafter, prompts, rule = pair
    seen = []

    def recording(sess, front, rule, s, ahead, stops, generator=None):
        d = fast.draft_one_sync(sess, front, rule, s, ahead, stops, generator)
        seen.append((list(front.context), list(front.host), front.pos[0].item(), ahead, d.tokens))
        return d
    # the rule: 1 step a ms; drafted: 3 steps in k + 1 ms, more only when k = 1
    gate = fast.gated(recording, flat_cost(), dict(step_s=[1e-3] * 4), (3.0, 5.0))
    outs = run(pair, gate, 64, lookahead=0)
    for ids, (out, st) in zip(prompts, outs):
        assert out == generate(target, ids, 64, rule)[0]
        assert 0 < st["round_ends"].get("nothing drafted", 0) < st["nfe"] - 1    # some of each
    s = Settings(lookahead=0).for_block(4)
    grew = [len(b[0]) - len(a[0]) for a, b in zip(seen, seen[1:])]
    assert max(grew) >= 8          # some draft came two or more blocks after the one before it
    for context, host, start, ahead, tokens in seen:
        sess = Session(drafter, 4, start + 8 * 4)
        sess.prefill(torch.tensor(context))
        front = Frontier(torch.tensor(host), torch.arange(start, start + 4), host.count(rule.mask_id), host)
        assert fast.draft_one_sync(sess, front, rule, s, ahead, set()).tokens == tokens


def test_the_tool_times_the_drafting_and_the_table_names_the_drafter(tmp_path):
    path = tmp_path / "tiny"
    checkpoint.save_pretrained(make_model(n_layer=2, block_size=4), path, dtype=torch.float32)
    costs_script.main(str(path), block_sizes=(4,), repeats=1, drafter=str(path))
    model = checkpoint.from_pretrained(path, dtype=torch.float32)
    written = costs.table_path(path, model, 4)
    t = json.loads(written.read_text())
    assert t["draft"]["model"] == costs.model_shape(model.config) and len(t["draft"]["step_s"]) == 4
    cost = costs.load(written, model, 4)
    assert costs.drafting(cost, model) == t["draft"] and all(x > 0 for x in t["draft"]["step_s"])
    assert t["draft"]["round_s"] >= 0
    assert costs.drafting(cost, make_model(n_layer=3, block_size=4)) is None   # another shape
    assert "--drafter" in costs.remeasure(t, written)
    b = t["batch"]
    assert b["requests"] == list(costs.BATCH) and all(y >= x > 0 for x, y in zip(b["one_s"], b["two_s"]))
    written.write_text(json.dumps(dict(t, draft=dict(t["draft"], step_s=[0.0]))))
    with pytest.raises(ValueError, match="malformed cost table"):
        costs.load(written, model, 4)


def test_a_table_that_timed_no_drafter_prices_drafting_by_a_stated_model(pair):
    """A drafter step priced as a target forward of the same rows times their parameters' ratio
    (a mixture of experts': the top_k experts a token uses); said in the summary line; gated."""
    target, drafter, _, rule = pair
    ratio = sum(p.numel() for p in drafter.parameters()) / sum(p.numel() for p in target.parameters())
    d = costs.drafting(flat_cost(), drafter, target)
    assert d["stated"] == pytest.approx(ratio) and d["step_s"] == pytest.approx([ratio * 1e-3] * 4)
    assert costs.drafting(flat_cost(), drafter) is None and costs.drafting(None, drafter, target) is None
    other = flat_cost()
    other.drafting = dict(model="another shape", step_s=[1.0] * 4, round_s=0.0)     # timed, another drafter
    assert costs.drafting(other, drafter, target)["stated"] == pytest.approx(ratio)
    shared = costs.costs_in(costs.cost_of(dict(block_size=4, rows=[4, 64], seconds=[1e-3, 1e-3], batch=dict(
        requests=[1, 16], one_s=[1e-3, 4e-3], two_s=[2e-3, 8e-3]))), 16)           # a request's share of a batch:
    assert costs.drafting(shared, drafter, target)["step_s"] == pytest.approx([ratio * 1e-3] * 4)   # the solo price
    p = price("simsd", ROOT / "models" / "target", target, rule, drafter, table=flat_cost())
    assert f"drafting priced at {ratio:.2f}x a target forward" in p.note and p.draft is not fast.draft_one_sync
    assert "drafting priced at" not in price("simsd", ROOT / "models" / "target", target, rule, drafter,
                                             table="flat").note            # flat: drafting free
    moe = dict(n_experts=4, moe_intermediate_size=16)
    dense, half, whole = (make_model(**moe, top_k=k) if k else make_model() for k in (0, 2, 4))
    experts = sum(p.numel() for n, p in half.named_parameters() if n.endswith(("mlp.gate", "mlp.up", "mlp.down")))
    assert experts > 0
    assert costs.active_params(dense) == sum(p.numel() for p in dense.parameters())
    assert costs.active_params(whole) == sum(p.numel() for p in whole.parameters())
    assert costs.active_params(half) == sum(p.numel() for p in half.parameters()) - experts / 2
    untied = make_model(tie_embeddings=False)
    assert costs.active_params(untied) == sum(p.numel() for p in untied.parameters()) - untied.embed.weight.numel()


def test_a_flat_table_keeps_every_copy_and_prices_no_drafting():
    from verify import Guesses
    g = Guesses(torch.zeros(5, 4, dtype=torch.long), [4, 3, 2, 1, 0], None, [1.0, 0.9, 0.5, 0.1, 0.01])
    cost, words = costs.cost_model(None, None, 4, "flat")
    assert len(fast.sized(g, cost).n_masked) == 5 and costs.drafting(cost, None) is None and "flat" in words


def test_the_shipped_reach_tables_give_simsd_its_means_a_round(pair):
    rule = pair[3]
    steps, copies = reach.per_round(ROOT / "models" / "target", "simsd", rule)
    assert 1 <= steps <= 1 + copies
    other = cli.make_rule(pair[0], 4, 0.5)                                   # no table for it
    assert reach.per_round(ROOT / "models" / "target", "simsd", other) is None


def test_declined_rounds_on_the_temporal_mask_are_the_rules_own_steps(pair):
    """The temporal path is gated too: a round priced out proposes nothing, and the target's
    own step on the undrafted slots (speculate.accept_temporal) is then the rule's step."""
    target, _, prompts, rule = pair
    gate = fast.gated(fast.draft_one_sync, flat_cost(), dict(step_s=[1.0] * 4), (3.0, 0.5))
    for ids, (out, st) in zip(prompts, run(pair, gate, verifier="temporal", acceptance="paper")):
        plain, pst = generate(target, ids, 48, rule)
        assert out == plain and st["nfe"] == pst["nfe"] and st["nfe_draft"] <= 1
        assert st["round_ends"] == {"nothing drafted": st["nfe"] - 1}


def test_the_command_lines_price_the_temporal_path_by_its_own_tables(pair):
    """Its drafter gated by simsd-temporal's means a round; a method whose rounds would pay in
    none (lookup's on the temporal mask reveal fewer tokens a round than the rule's step) runs
    the rule alone; the copies' acceptance ablations draft in every round."""
    target, drafter, _, rule = pair
    where = ROOT / "models" / "target"
    cost = flat_cost()
    cost.drafting = dict(model=costs.model_shape(drafter.config), step_s=[1e-6] * 4, round_s=0.0)   # (its round pays)
    assert reach.method_of("simsd", "lookup", "temporal") == "simsd-lookup-temporal"
    assert reach.method_of("simsd", None, "temporal") == "simsd-temporal"
    assert price("simsd-temporal", where, target, rule, drafter, table=cost, lossless=False).draft \
        is not fast.draft_one_sync
    assert price("simsd", where, target, rule, drafter, table=cost, lossless=False).draft is fast.draft_one_sync
    steps, _ = reach.per_round(where, "simsd-lookup-temporal", rule)
    alone = price("simsd-lookup-temporal", where, target, rule, table="flat", lossless=False)
    assert steps < fast.MARGIN and alone.alone and alone.why.endswith("the rule alone")
    steps, copies = reach.per_round(where, "simsd-temporal", rule)
    assert steps > 1 and 0 < copies < 1             # drafts: at most a block (no lookahead)


def test_a_request_in_a_batch_pays_its_share_of_the_round():
    t = dict(block_size=4, rows=[4, 64], seconds=[4e-3, 8e-3],
             batch=dict(requests=[1, 4, 8, 16], one_s=[4e-3, 6e-3, 9e-3, 16e-3], two_s=[5e-3, 8e-3, 13e-3, 24e-3]))
    cost = costs.cost_of(t)
    assert costs.costs_in(cost, 1) is cost and costs.costs_in(costs.cost_of(dict(t, batch=None)), 8)(1) == cost(1)
    in16, in12 = costs.costs_in(cost, 16), costs.costs_in(cost, 12)
    assert in16(1) == pytest.approx(1e-3) and in16(3) == pytest.approx((16e-3 + 2 * 8e-3) / 16)
    assert in12(1) == pytest.approx(12.5e-3 / 12)                     # between 8 and 16 requests
    # the rule alone, 1 ms a request-round; a copy 0.5 ms more: 1.3 steps for 0.5 copies no longer pay
    assert fast.pays(cost, (1.3, 0.5)) and not fast.pays(in16, (1.3, 0.5))
    assert not fast.pays(cost, (1.05, 0.0))          # 5% more steps for nothing: within the margin


def test_simsd_runs_its_rule_alone_where_the_round_it_drafts_would_not_pay(pair):
    """Decided at the spend of the full round the decoder drafts (its drafter steps, at its
    lookahead's price), not at the cheapest one: where that round would not pay, the rule runs alone.
    The temporal path drafts the open block alone (lookahead 0), and is priced so."""
    target, drafter, _, rule = pair
    cost, where = flat_cost(), ROOT / "models" / "target"
    cost.drafting = dict(model=costs.model_shape(drafter.config), step_s=[5e-6, 5e-4, 5e-4, 1e-3], round_s=0.0)
    steps, copies = reach.per_round(where, "simsd", rule)
    assert not fast.pays(cost, (steps, copies), 3e-3) and fast.pays(cost, (steps, copies), 1.5e-3)
    full = price("simsd", where, target, rule, drafter, table=cost)                      # 3 steps 3 blocks ahead
    assert full.alone and full.cut is None and full.learn is None         # (nothing built for rounds never run)
    assert not price("simsd", where, target, rule, drafter, table=cost, settings=dict(lookahead=1)).alone
    assert not price("simsd", where, target, rule, drafter, table=cost, settings=dict(draft_steps=1)).alone
    steps, copies = reach.per_round(where, "simsd-temporal", rule)
    assert fast.pays(cost, (steps, copies), 1.5e-5) and not fast.pays(cost, (steps, copies), 3e-3)
    assert not price("simsd-temporal", where, target, rule, drafter, table=cost, lossless=False).alone   # 3 x 5e-6
