"""Many prompts decoded together (serve/batch.py) write exactly what each writes alone.

Every decoder the command lines compose (sample.load), at B = 4, 8 and 32, greedy and
sampled, on prompts cut at random lengths, more prompts than slots: each request's tokens and
counts equal its solo run's, request i seeded with seed + i. Each decoder's test also shows it
exercised what matters (slots reused, rounds that took more than one step), so it cannot pass
vacuously. Below that, the property it rests on: a row's logits in a packed forward are its
solo forward's, bit for bit on the CPU, and a planted row-dependent perturbation is caught."""
import json
import random
import threading
from collections import Counter

import pytest
import torch

import sample
from conftest import make_model
from decode import Session, packed_rows
import fast
import serve.batch
from serve.batch import decode_all, rows_keep_their_bits
from loading.checkpoint import PRESETS
from measure import costs

QA = ("Question: Max saves 4 dollars a week for 4 weeks and already had 2 dollars. How much does "
      "Max have now?\nAnswer: 4 * 4 = 16. 16 + 2 = 18. The answer is 18.\n\n")
TEXT = QA + QA + ("ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and "
                  "Juliet is the sun.\n")   # (a question asked twice: lookup finds what to propose)
DECODERS = {  # name -> (sample.py's --spec, the method's flags)
    "threshold": ("none", {}),
    "simsd": ("simsd", {}),
    "simsd-temporal": ("simsd", dict(verifier="temporal", acceptance="paper")),
    "simsd-trajectory": ("simsd", dict(reference="trajectory")),
    "simsd-lookup": ("simsd", dict(reference="lookup")),
    "spiffy": ("spiffy", {}),
}


def prompts(rng, tok, n):
    ids = tok.encode(TEXT)
    out = []
    for _ in range(n):
        length = rng.randint(1, 96)
        start = rng.randint(0, len(ids) - length)
        out.append(ids[start:start + length])
    return out


def prepared(spec, B, temperature, flags, strategy=None, batch=1):
    """sample.py's decoder for `spec` and its flags, priced as a request of a batch of `batch`."""
    dec, tok = sample.load(spec, block_size=B, temperature=temperature, strategy=strategy, batch=batch, **flags)
    return tok, dec


def multistep(stats):
    """Rounds that took more than one step: walked through copies, or accepted drafts."""
    return sum(n for k, n in stats.get("steps_per_forward", {}).items() if k > 1) + \
        sum(n for k, n in stats.get("accept_hist", {}).items() if k > 0)


EXACT = rows_keep_their_bits()
needs_exact = pytest.mark.skipif(not EXACT, reason="this CPU's matrix products round a row by the "
                                 "product's row count (serve.batch.rows_keep_their_bits): no bitwise promise")


@needs_exact
@pytest.mark.parametrize("name", list(DECODERS))
def test_batched_equals_alone_for_every_decoder(name):
    spec, flags = DECODERS[name]
    rng, reused, steps, compared = random.Random(f"batch-{name}"), 0, 0, 0
    sampled_at = rng.choice([8, 32])   # greedy and sampled at B = 4, one of each at 8 and 32
    for B, temperature in [(4, 0.0), (4, 0.8), (8, 0.8 * (sampled_at == 8)), (32, 0.8 * (sampled_at == 32))]:
        strategy = rng.choice([None, None, "low_confidence_static", "entropy_bounded"]) if spec == "none" else None
        tok, dec = prepared(spec, B, temperature, flags, strategy)
        slots, seed, n = rng.randint(1, 3), rng.randint(0, 99), rng.randint(4, 24)
        ps = prompts(rng, tok, slots + 1)
        alone = [dec(p, n, torch.Generator().manual_seed(seed + i)) for i, p in enumerate(ps)]
        together, pools = decode_all(lambda i, p, t, d: dec(p, n, torch.Generator().manual_seed(seed + i),
                                                            models=(t, d)), ps, dec.models, slots)
        for i, ((a, sa), (b, sb)) in enumerate(zip(alone, together)):
            assert a == b, f"{name} B={B} T={temperature} prompt {i} of {len(ps)}, {slots} slots"
            assert (sa["nfe"], sa["rows"], sa.get("nfe_draft")) == (sb["nfe"], sb["rows"], sb.get("nfe_draft"))
        reused += len(ps) - slots
        steps += sum(multistep(s) for _, s in together)
        compared += len(ps)
    print(f"{name}: {compared} requests compared, {reused} slots reused, {steps} multi-step rounds")
    assert reused > 0 and (steps > 0 or spec == "none")


def batch_priced_table(drafter_shape):
    """A B = 8 cost model shaped like the AMD EPYC's tables, with a cheap drafter: alone, copies
    nearly free; a request's share of a batched round of 8 makes each copy a quarter of a round."""
    return costs.cost_of(dict(block_size=8, rows=[8, 16, 32, 64, 128], seconds=[4.5e-3, 4.5e-3, 4.9e-3, 6.0e-3, 7.8e-3],
                              batch=dict(requests=[1, 4, 8], one_s=[5.2e-3, 6.9e-3, 9.0e-3], two_s=[5.2e-3, 7.9e-3, 11.3e-3]),
                              draft=dict(model=drafter_shape, step_s=[2e-4] * 4, round_s=1e-4)))


@needs_exact
@pytest.mark.parametrize("name", ["simsd", "simsd-temporal", "spiffy"])
def test_a_batched_request_is_its_solo_run_priced_at_the_batchs_share(name):
    """A request of a batch of N is priced at its share of a batched round (costs.costs_in), so
    its tokens and counts are those of its solo run priced at the same N (sample.load's batch=N).
    Priced as a lone request (N = 1) it may buy other copies: the lossless decoders still write the same
    tokens; on the temporal path the gate decides the text, so it may differ (reported here)."""
    spec, flags = DECODERS[name]
    table = batch_priced_table(costs.model_shape(sample.load("simsd")[0].drafter.config))
    tok, at_8 = prepared(spec, 8, 0.0, dict(flags, cost_table=table), batch=8)
    _, at_1 = prepared(spec, 8, 0.0, dict(flags, cost_table=table))
    assert at_8.pricing.alone and not at_1.pricing.alone, "the batch's share must change the decision"
    ps = prompts(random.Random(f"share-{name}"), tok, 10)
    solo_8 = [at_8(p, 24, torch.Generator().manual_seed(i)) for i, p in enumerate(ps)]
    together, _ = decode_all(lambda i, p, t, d: at_8(p, 24, torch.Generator().manual_seed(i), models=(t, d)),
                             ps, at_8.models, 8)
    for (a, sa), (b, sb) in zip(solo_8, together):
        assert a == b and (sa["nfe"], sa["rows"], sa.get("nfe_draft")) == (sb["nfe"], sb["rows"], sb.get("nfe_draft"))
    solo_1 = [at_1(p, 24, torch.Generator().manual_seed(i)) for i, p in enumerate(ps)]
    same = sum(a == b for (a, _), (b, _) in zip(solo_1, together))
    print(f"{name}: {same} of {len(ps)} requests write their tokens priced as a lone request")
    assert same == len(ps) or name == "simsd-temporal"
    counts = lambda runs: [(s["nfe"], s["rows"], s.get("nfe_draft")) for _, s in runs]   # noqa: E731
    assert counts(solo_1) != counts(together)        # alone, it bought copies the batch did not


def test_counts_repeat_exactly():
    tok, dec = prepared("simsd", 4, 0.8, {})
    ps = prompts(random.Random(1), tok, 5)
    go = lambda: decode_all(lambda i, p, t, d: dec(p, 16, torch.Generator().manual_seed(i), models=(t, d)),
                            ps, dec.models, 3)
    (a, pa), (b, pb) = go(), go()
    assert [x for x, _ in a] == [x for x, _ in b]
    assert [(p.forwards, p.query_rows) for p in pa] == [(p.forwards, p.query_rows) for p in pb]
    assert pa[0].forwards < sum(s["nfe"] for _, s in a)      # forwards were shared


def test_requests_run_on_one_torch_thread_and_a_batch_of_one_in_the_callers():
    """A request's own ops run on one torch thread (a team of more would spin on the cores the
    batch's forward needs: experiments/batch_threads.py), torch's count is as found after, and
    a batch of one runs in the caller's thread, on the caller's count."""
    torch.set_num_threads(2)
    try:
        seen = lambda i, p: (threading.current_thread(), torch.get_num_threads())
        (a, b), _ = decode_all(seen, [0, 1], (), 2)
        assert a[1] == b[1] == 1 and a[0] is not threading.current_thread()
        assert decode_all(seen, [0], (), 1)[0] == [(threading.current_thread(), 2)]
        with pytest.raises(ZeroDivisionError):   # a request that fails
            decode_all(lambda i, p: 1 / i, [1, 0, 2], (), 2)
        later = []   # the count a new thread starts with, as found
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start(), t.join()
        assert later == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_a_model_no_request_used_holds_no_cache():
    """A drafter no request ran (SimSD running the rule alone) reserved no slot: 0 bytes."""
    assert serve.batch.Pool(make_model(**PRESETS["tiny"]), 4).slot_bytes() == 0


def test_a_pool_grown_keeps_every_slots_rows():
    """Pool.reserve: room for longer slots, or for spare rows past the slots (static shapes'
    padding), is a bigger cache with every slot's rows where its forwards find them."""
    model = make_model(**PRESETS["tiny"])
    pool = serve.batch.Pool(model, 3)
    pool.reserve(100)
    L = pool.slot_len
    model.kv.copy_(torch.randn(model.kv.shape))
    rows = [model.kv[..., i * L:(i + 1) * L, :].clone() for i in range(3)]
    for max_len, spare in ((100, 8), (L + 1, 0), (L + 1, 3 * L)):
        pool.reserve(max_len, spare)
        assert model.kv.shape[-2] >= 3 * pool.slot_len + spare and pool.slot_len >= max_len
        for i, r in enumerate(rows):
            assert torch.equal(model.kv[..., i * pool.slot_len:i * pool.slot_len + L, :], r)


def logits_of(model, ps, B=4):
    """Each prompt's logits at a prefill and at its first open block, as Session computes them."""
    mask_id, out = model.config.mask_token_id, []
    for p in ps:
        sess = Session(model, B, 256)
        n = len(p) // B * B
        sess.prefill(torch.tensor(p[:n]))
        block = torch.tensor(p[n:] + [mask_id] * (B - len(p) + n))
        logits = sess.forward(block, torch.arange(n, n + B), keep=B,
                              rows=packed_rows(block, mask_id, B - len(p) + n))
        out.append(logits)
    return out


def rows_independent(model, ps):
    """A row's logits packed with other requests' == its solo forward's, bit for bit."""
    alone = [logits_of(model, [p])[0] for p in ps]
    together, _ = decode_all(lambda i, p, t: logits_of(t, [p])[0], ps, (model,), len(ps))
    return all(torch.equal(a, b) for a, b in zip(alone, together))


@needs_exact
def test_a_rows_logits_do_not_depend_on_the_other_rows():
    tok, dec = prepared("none", 4, 0.0, {})
    model = dec.target
    ps = prompts(random.Random(2), tok, 6)
    assert rows_independent(model, ps)
    moe = make_model(**{**PRESETS["tiny-moe"], "n_layer": 2}, seed=3)   # a mixture of experts too
    rng = random.Random(3)
    assert rows_independent(moe, [[rng.randrange(4, 97) for _ in range(rng.randint(1, 30))] for _ in range(6)])
    trunk = model.trunk   # planted: every row shifted by the mean of all the forward's rows
    model.trunk = lambda *a: (lambda x: x + 1e-3 * x.mean(1, keepdim=True))(trunk(*a))
    try:
        assert not rows_independent(model, ps)
    finally:
        del model.trunk


@needs_exact
def test_sample_prompts_file_equals_each_prompt_alone(tmp_path, capsys):
    """python sample.py --prompts-file F --batch 2 --json: a line a prompt, in the file's order,
    each as `--prompt <it> --seed <seed + i>` writes it, then the summary."""
    questions = ["ROMEO:", "Question: 7 * 8 = ?\nAnswer:", "But soft, what light"]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(dict(question=q, answer="x")) + "\n" for q in questions))
    sample.main(spec="simsd", prompts_file=str(f), batch=2, seed=5, max_new_tokens=12, as_json=True)
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [r["prompt"] for r in lines[:-1]] == [0, 1, 2] and lines[-1]["prompts"] == 3
    for i, q in enumerate(questions):
        out, _ = sample.main(spec="simsd", prompt=q, seed=5 + i, max_new_tokens=12, as_json=True)
        assert lines[i]["token_ids"] == out
    capsys.readouterr()


@pytest.fixture
def static(monkeypatch):
    """static(*models): until undone (-> undo) or the test ends, static shapes as
    fast.compile_static installs them, uncompiled (as gpu_check.sh's dry run runs them): a
    batch's forwards are bucketed (Pool.bucketed)."""
    monkeypatch.setattr(serve.batch, "static_trunk", lambda cls, cuda: cls.trunk)
    installed = []

    def install(*models):
        models = [m for m in models if m is not None]
        for m in models:
            fast.static_shapes(m, type(m).trunk)
        installed.extend(models)
        return lambda: [fast.eager_again(m) for m in models]
    yield install
    for m in installed:
        fast.eager_again(m)


def test_static_shapes_one_attention_call_sees_what_each_request_sees_alone(static):
    """Pool.bucketed: ONE attention call over the whole pool, the rows padded to a power of two.
    A request's logits are its solo forward's to rounding, not bit for bit (its attention runs
    over every slot's keys, masked), on the embedded target and a mixture of experts: a query
    that saw another request's keys, or a padding row's, would be off by far more."""
    rng = random.Random(4)
    tok, dec = prepared("none", 4, 0.0, {})
    moe = make_model(**{**PRESETS["tiny-moe"], "n_layer": 2}, seed=3)
    for model, ps in ((dec.target, [p for p in prompts(rng, tok, 9) if len(p) >= 4][:5]),
                      (moe, [[rng.randrange(4, 97) for _ in range(rng.randint(5, 30))] for _ in range(5)])):
        alone = [logits_of(model, [p])[0] for p in ps]
        undo = static(model)
        together, (pool,) = decode_all(lambda i, p, t: logits_of(t, [p])[0], ps, (model,), len(ps))
        undo()
        assert pool.buckets == {32: 1}   # 5 open blocks of 4 rows: one call (prefills: packed)
        for a, b in zip(alone, together):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["simsd", "simsd-temporal", "spiffy"])
def test_static_shapes_batched_equals_alone(name, static):
    """Decoders through the bucketed forwards (the target's and the drafter's) write what each
    prompt writes alone on these cases, greedy and sampled: the rounding above moved no token."""
    spec, flags = DECODERS[name]
    rng, buckets = random.Random(f"static-{name}"), Counter()
    for B, temperature in [(4, 0.0), (8, 0.8)]:
        tok, dec = prepared(spec, B, temperature, flags)
        ps, n = prompts(rng, tok, 3), rng.randint(8, 16)
        seeded = lambda i: torch.Generator().manual_seed(i)
        alone = [dec(p, n, seeded(i)) for i, p in enumerate(ps)]
        undo = static(*dec.models)
        together, pools = decode_all(lambda i, p, t, d: dec(p, n, seeded(i), models=(t, d)), ps, dec.models, 2)
        undo()
        assert [a for a, _ in alone] == [b for b, _ in together], f"{name} B={B} T={temperature}"
        buckets += pools[0].buckets
    assert len(buckets) > 1, buckets   # more than one bucket of rows
