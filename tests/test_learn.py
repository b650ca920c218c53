"""Speculation priced by a request's own rounds (measure.pricing.Learner).

First the rule alone, on rounds made up here: a proposer that never pays is off within 8
rounds and tried again after 2, 4, ... 64 rounds; one that pays is never off; one that turns
to paying comes back at its next probe. Then the embedded models, priced by a fixed table shaped
as this project's AMD EPYC one (so the cases do not depend on the machine): on open text SimSD
switches its drafter off and drafts again later, and writes the threshold rule's tokens; counts
repeat; nothing is learned without a table (--cost-table none), under a flat one, or where the
tables say no round pays (the rule runs alone)."""
from types import SimpleNamespace

import pytest
import torch

import fast
import sample
from measure import costs
from measure.pricing import Learner
from verify import Guesses

AMD_B4 = dict(block_size=4, rows=[4, 8, 16, 32, 64], seconds=[4.53e-3, 4.54e-3, 4.92e-3, 5.98e-3, 7.80e-3])
DRAFT = dict(step_s=[1.92e-3, 1.70e-3, 1.80e-3, 1.96e-3], round_s=1.4e-4)


def run(learner, steps_at, n=200, copies=4, spend=3 * 1.92e-3):
    """n rounds whose speculation walks steps_at(round) steps (a round not speculating: 1, no
    copies) -> the rounds (1-based) that speculated."""
    speculated = []
    for r in range(1, n + 1):
        on = learner.wants(spend)
        c = copies if on else 0
        g = SimpleNamespace(n_masked=[4] * (1 + c), reach=None, drafted=[0] + [1] * c, after=None)
        w = SimpleNamespace(path=[None] * (steps_at(r) if on else 1), crossed=[], visited=[], copies=[], host=None)
        learner.lossless(g, w)
        speculated += [r] * on
    return speculated


def learner(prior=(3.0, 4.0)):
    return Learner(costs.cost_of(AMD_B4), prior, DRAFT)


def test_a_proposer_that_never_pays_is_off_within_8_rounds_and_probed_ever_more_rarely():
    on = run(learner(), lambda r: 1)
    first_off = next(r for r in range(1, 10) if r not in on)
    assert first_off <= 8
    gaps = [b - a - 1 for a, b in zip(on, on[1:]) if b > a + 1]   # rounds off before each probe
    assert gaps == [2, 4, 8, 16, 32, 64, 64]


def test_a_proposer_that_pays_is_never_off():
    assert run(learner(), lambda r: 6) == list(range(1, 201))


def test_a_proposer_comes_back_when_the_text_turns_predictable():
    lr = learner()
    on = run(lr, lambda r: 1 if r <= 40 else 6)
    back = next(r for r in on if r > 40)
    assert on[on.index(back):] == list(range(back, 201)) and back <= 40 + 32
    assert lr.hist("learned")["back on"] == 1 and lr.hist("learned")["switched off"] >= 4


def test_a_copy_rank_the_walk_does_not_visit_is_valued_less_and_later_again_as_the_table_says():
    """Spiffy's reach per copy rank: the table's scale (prior), amended by the copies this
    request verified. Copies the walk never visits lose half their value or more in 8 rounds; rounds
    that verify none of them let the table's scale come back (FADE), so the rank is bought again."""
    cost = costs.cost_of(AMD_B4)
    lr = Learner(cost, (1.2, 2.0), scale=[1.0, 0.8], sized=fast.cutter(cost, None, 4))
    cut = lr.cut
    walks = SimpleNamespace(path=[None] * 6, crossed=[], visited=[], copies=[], host=None)   # (a round that pays)
    g = Guesses(torch.zeros(4, 4, dtype=torch.long), [4, 3, 2, 1], None, [1.0, 0.9, 0.9, 0.9])
    tables = fast.cutter(cost, None, 4, [1.0, 0.8])(g)   # before any round: the tables' own cut, exactly
    assert lr.scale() == [1.0, 0.8, 0.8] and (cut(g).reach, cut(g).n_masked) == (tables.reach, tables.n_masked)
    assert cut(g).reach == pytest.approx([1.0, 0.9, 0.72, 0.72])
    for _ in range(8):
        lr.lossless(cut(g), walks)             # verified, never walked
    assert lr.scale()[0] < 0.5 and cut(g).reach[1] < 0.45
    alone = Guesses(g.copies[:1], [4], None, [1.0])
    for _ in range(40):
        lr.lossless(cut(alone), walks)         # no copy of rank 1 verified: the table's returns
    assert lr.scale()[0] > 0.9 and lr.n["learned", "switched off"] == 0


@pytest.fixture(scope="module")
def priced():
    dec = sample.load("simsd")[0]
    shape = costs.model_shape(dec.drafter.config)
    return costs.cost_of(dict(AMD_B4, draft=dict(DRAFT, model=shape)))


def test_on_open_text_simsd_switches_its_drafter_off_and_drafts_again_losslessly(priced):
    """"ROMEO:" and 128 tokens: the drafter proposes what the target rarely takes."""
    dec, tok = sample.load("simsd", cost_table=priced)
    plain, _ = sample.load("none")
    ids = tok.encode("ROMEO:")
    out, stats = dec(ids, 128)
    again, stats_again = dec(ids, 128)
    assert out == plain(ids, 128)[0] == again
    learned = stats["learned"]
    assert learned["switched off"] >= 1 and learned["probes"] >= 1
    assert stats["nfe_draft"] < 0.5 * stats["tokens"]          # drafting every round: about 3 a token
    same = lambda s: {k: v for k, v in s.items() if k not in ("seconds", "tokens_per_s")}   # noqa: E731
    assert same(stats) == same(stats_again)                   # counts repeat


@pytest.mark.parametrize("table", ["none", "flat"])
def test_nothing_is_learned_without_a_table_or_under_a_flat_one(table):
    dec, tok = sample.load("simsd", cost_table=table)
    assert dec.pricing.learn is None
    assert "learned" not in dec(tok.encode("ROMEO:"), 16)[1]


def test_where_the_tables_say_no_round_pays_the_rule_runs_alone_unlearned():
    dearer = costs.cost_of(dict(AMD_B4, draft=dict(DRAFT, step_s=[1.0] * 4, model=costs.model_shape(
        sample.load("simsd")[0].drafter.config))))   # a drafter step of a second: no round pays
    dec, _ = sample.load("simsd", cost_table=dearer)
    assert dec.pricing.alone and dec.pricing.learn is None and dec.rule_only


def test_spiffy_learns_too(priced):
    dec, tok = sample.load("spiffy", cost_table=priced)
    assert dec.pricing.learn is not None and "learned" in dec(tok.encode("ROMEO:"), 32)[1]


def test_a_batched_request_learns_as_alone(priced):
    """Each request keeps its own Learner: decoded 3 at a time, each writes its solo run's tokens
    and counts, its switch-offs included."""
    from serve.batch import decode_all
    dec, tok = sample.load("simsd", cost_table=priced)
    ps = [tok.encode(t) for t in ("ROMEO:", "KING HENRY:", "Question: Max saves 4 dollars a week.", "JULIET:")]
    alone = [dec(p, 48) for p in ps]
    together, _ = decode_all(lambda i, p, t, d: dec(p, 48, models=(t, d)), ps, dec.models, 3)
    for (a, sa), (b, sb) in zip(alone, together):
        assert a == b and (sa["nfe"], sa["nfe_draft"], sa["learned"]) == (sb["nfe"], sb["nfe_draft"], sb["learned"])
    assert any(s["learned"].get("switched off") for _, s in alone)
