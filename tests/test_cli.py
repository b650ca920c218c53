"""The command-line tools on the shipped models: sample.py, bench.py, train.py and calibration.

These use the embedded checkpoints in models/ (the ones the README's numbers come from); bad
input through the tools themselves is tests/test_errors.py."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

import bench
from loading import checkpoint
import cli
import decoder
import fast
from training import objective
import sample
from measure import sol
import train
from conftest import ROOT, tiny_corpus
from fixtures.record_greedy import FIXTURE, greedy
from decode import generate
from model import ModelConfig, Transformer
from loading.checkpoint import PRESETS
from training.tasks import extract_answer, problems
from cli import DEFAULT_DRAFTER, DEFAULT_TARGET
from speculate import simsd_generate
from variants import simsd
from loading.tokenizer import load_tokenizer


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.parametrize("spec", ["none", "simsd", "spiffy"])
def test_sample_json_line_has_the_documented_fields(spec, capsys):
    out, stats = sample.main(spec=spec, max_new_tokens=24, as_json=True)
    rec = last_json(capsys.readouterr().out)
    assert {"text", "token_ids", "nfe_target", "nfe_draft", "tokens_per_s"} <= set(rec)
    assert rec["token_ids"] == out and rec["nfe_target"] == stats["nfe"]
    assert (rec["nfe_draft"] > 0) == (spec == "simsd")


def test_sample_streams_the_text_it_returns(capsys):
    out, _ = sample.main(spec="none", max_new_tokens=24)
    printed = capsys.readouterr().out
    tok = load_tokenizer(DEFAULT_TARGET)
    assert sample.DEFAULT_PROMPT + tok.decode(out) in printed


def test_shipped_models_reproduce_the_recorded_greedy_output():
    """Guards the checkpoints and the whole decode path against silent changes."""
    fixture = json.loads(FIXTURE.read_text())
    for name, path in (("target", DEFAULT_TARGET), ("drafter", DEFAULT_DRAFTER)):
        assert greedy(path, fixture["prompt"]) == fixture[name], name


def test_simsd_on_the_embedded_models_commits_many_tokens_per_target_forward():
    """sample.py's SimSD (lossless, threshold rule) at B=4 commits over 2 tokens per target
    forward (commits included; plain decoding: 0.85) and gives the target's own threshold
    decoding; gated SimSD on the one-token rule keeps plain decoding's answers. The figures on
    200 problems are bench.py's (README)."""
    target, tok = cli.load(DEFAULT_TARGET)
    drafter, _ = cli.load(DEFAULT_DRAFTER)
    static, threshold = cli.make_rule(target, 4), cli.make_rule(target, 4, cli.THRESHOLD)
    tokens = nfe = plain_ok = gated_ok = 0
    for p in problems(30, "test"):
        ids = tok.encode(f"Question: {p['question']}\nAnswer:")
        b, st = simsd_generate(target, drafter, ids, 64, threshold, eos_id=tok.eos_id)
        assert b == generate(target, ids, 64, threshold, eos_id=tok.eos_id)[0]
        tokens, nfe = tokens + st["tokens"], nfe + st["nfe"]
        a, _ = generate(target, ids, 64, static, eos_id=tok.eos_id)
        c, _ = simsd(target, drafter, ids, 64, static, acceptance="gated", eos_id=tok.eos_id)
        plain_ok += extract_answer(tok.decode(a)) == p["result"]
        gated_ok += extract_answer(tok.decode(c)) == p["result"]
    assert tokens / nfe >= 2.0
    assert abs(plain_ok - gated_ok) <= 1  # of 30


def test_drafter_with_another_tokenizer_is_refused(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    for f in ("config.json", "model.safetensors"):
        (drafter / f).write_bytes((DEFAULT_DRAFTER / f).read_bytes())
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(drafter / "tokenizer"),
                                   vocab_size=40, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=-1, eos_id=2,
                                   user_defined_symbols=["<|mask|>"], minloglevel=2)
    with pytest.raises(ValueError, match="drafter.*target|target.*drafter"):
        sample.main(spec="simsd", drafter=str(drafter), max_new_tokens=8)


def test_bench_quick_reports_every_method(capsys):
    status = bench.main(**bench.parse_args(["--quick"]))
    rec = last_json(capsys.readouterr().out)
    assert status == 0 and rec["lossless_ok"]
    assert [r["method"] for r in rec["results"]] == list(bench.METHODS)
    fields = {"tokens_per_s", "target_fwd_per_token", "draft_fwd_per_token", "tokens_per_target_fwd",
              "mean_per_round", "hist", "wall_s", "warmup_s", "accuracy", "speedup_vs_sdar",
              "speedup_vs_plain", "nfe_reduction_vs_sdar", "fraction_of_limit", "same_fraction",
              "target_rows_per_token", "gpu_fwd_equiv_per_token", "stops"}
    for r in rec["results"]:
        assert fields <= set(r), r["method"]
    by = {r["method"]: r for r in rec["results"]}
    assert by["simsd-gated"]["draft_fwd_per_token"] > 0 and by["plain"]["draft_fwd_per_token"] == 0
    assert by["spiffy+static"]["same_fraction"] == by["simsd-lossless+threshold"]["same_fraction"] == 1
    assert all(r["stops"].get("stop_id", 0) + r["stops"].get("max_new_tokens", 0) == rec["prompts"]
               for r in rec["results"])


def test_the_modelled_gpu_cost_is_a_roofline_of_the_counted_work():
    """Memory-bound forwards cost one target-forward equivalent each, whatever their rows; a
    forward past the ridge point costs in proportion to its rows; a drafter forward costs its
    share of the target's weights or its launch-bound floor, whichever is more; a host sync
    costs sync_s."""
    gpu = bench.GPU_MODEL
    (p_target, _), (p_drafter, layers) = (sol.preset_params(gpu[k]) for k in ("target", "drafter"))
    floor = 2 * p_target / gpu["bandwidth"]                 # seconds of one target forward
    ridge = gpu["flops"] / gpu["bandwidth"]                 # rows where compute equals the weight read
    assert bench.modelled_gpu_cost({4: 10, 40: 5}, {}, 30) == pytest.approx(15 / 30)
    assert bench.modelled_gpu_cost({round(4 * ridge): 1}, {}, 1) == pytest.approx(round(4 * ridge) / ridge)
    drafter = max(2 * p_drafter / gpu["bandwidth"], layers * gpu["layer_s"]) / floor
    assert bench.modelled_gpu_cost({}, {4: 1}, 1) == pytest.approx(drafter)
    assert drafter > p_drafter / p_target                    # the drafter is launch-bound
    assert bench.modelled_gpu_cost({4: 1}, {}, 1, syncs=2) == pytest.approx(1 + 2 * gpu["sync_s"] / floor)


def test_bench_takes_sample_py_s_spec_names(capsys):
    """--methods none,simsd,spiffy: the rows of the methods those specs run (all on the
    threshold rule, as sample.py's specs), under those methods' own names."""
    bench.main(**bench.parse_args(["--prompts", "1", "--max-new-tokens", "8", "--methods",
                                   "none,simsd,spiffy"]))
    rec = last_json(capsys.readouterr().out)
    assert [r["method"] for r in rec["results"]] == ["threshold", "simsd-lossless+threshold", "spiffy+threshold"]
    with pytest.raises(ValueError, match="listed twice"):
        bench.main(methods=("none", "threshold"))


def test_bench_compile_both_runs_every_method_eager_and_compiled_in_one_run(monkeypatch, capsys):
    """--compile both: a row eager and a row compiled for each method (a deep copy of each model,
    compiled: dynamo's eager backend here, to be quick), each compiled row compared with
    threshold compiled and with its own method eager, measured in the same run, a block size at
    a time (B = 32's rows grow the caches past what B = 4's were compiled for: its warm-up
    builds those graphs, after B = 4's timed passes)."""
    monkeypatch.setattr(fast, "compile_model", lambda m, how: fast.compile_dynamic(m, backend="eager"))
    status = bench.main(**bench.parse_args(["--prompts", "2", "--max-new-tokens", "8", "--methods",
                                            "threshold,simsd,spiffy", "--compile", "both",
                                            "--block-size", "4,32"]))
    out = capsys.readouterr().out
    rec = last_json(out)
    names = ["threshold", "simsd-lossless+threshold", "spiffy+threshold"]
    rows = [(r["method"], r["block_size"]) for r in rec["results"]]
    assert status == 0 and rows == [(m + c, b) for b in (4, 32) for c in ("", " compiled") for m in names]
    by = {r["method"]: r for r in rec["results"] if r["block_size"] == 4}
    for m in names:
        assert "speedup_vs_eager" not in by[m] and by[m + " compiled"]["same_as"] == "threshold compiled"
        assert by[m + " compiled"]["speedup_vs_eager"] == pytest.approx(
            by[m + " compiled"]["tokens_per_s"] / by[m]["tokens_per_s"])
        assert by[m + " compiled"]["nfe"] == by[m]["nfe"] and by[m + " compiled"]["same_fraction"] == 1
    assert by["threshold compiled"]["speedup_vs_threshold"] == 1 and " x eager" in out
    assert rec["dynamo"]["graphs_after_warmup"] == rec["dynamo"]["recompile_limit_hits"] == 0


def test_bench_batch_pairs_each_ratio_by_pass(capsys):
    """--batch: a row a method and batch size, each output its batch-1 output, and x threshold and
    x batch 1 the median of the passes' ratios (pass k of each row: round k), not of medians."""
    status = bench.main(**bench.parse_args(["--prompts", "3", "--max-new-tokens", "8", "--methods", "threshold,simsd",
                                            "--batch", "1,2", "--repeats", "3"]))
    rows = {(r["method"], r["batch"]): r for r in last_json(capsys.readouterr().out)["results"]}
    assert status == 0 and sorted(rows) == sorted((m, N) for m in ("threshold", "simsd-lossless+threshold") for N in (1, 2))
    for (m, N), r in rows.items():
        thr, one = rows["threshold", N], rows[m, 1]
        assert r["same_as_batch_1"] == 1 and len(r["pass_wall_s"]) == 3
        for key, o in (("speedup_vs_threshold", thr), ("speedup_vs_batch_1", one)):
            ratios = [a / b * r["tokens"] / o["tokens"] for a, b in zip(o["pass_wall_s"], r["pass_wall_s"])]
            assert r[key] == pytest.approx(sorted(ratios)[1])


def test_bench_ratios_are_the_median_of_the_passes_ratios(capsys):
    """Without --batch too: x threshold is the median of pass k's ratios (prompts interleaved), not
    a ratio of medians."""
    status = bench.main(**bench.parse_args(["--prompts", "3", "--max-new-tokens", "8", "--methods", "threshold,spiffy",
                                            "--repeats", "3"]))
    rows = {r["method"]: r for r in last_json(capsys.readouterr().out)["results"]}
    thr, r = rows["threshold"], rows["spiffy+threshold"]
    ratios = [a / b * r["tokens"] / thr["tokens"] for a, b in zip(thr["pass_wall_s"], r["pass_wall_s"])]
    assert status == 0 and len(r["pass_wall_s"]) == 3 and r["speedup_vs_threshold"] == pytest.approx(sorted(ratios)[1])
    assert thr["speedup_vs_threshold"] == 1


def test_bench_samples_at_a_temperature_and_the_lossless_rows_draw_their_references_tokens(capsys):
    """--temperature: every method's rule samples, each call seeded alike, so SimSD and Spiffy
    draw exactly `threshold`'s tokens; the outputs are not the greedy ones."""
    def run(*more):
        status = bench.main(**bench.parse_args(["--prompts", "2", "--max-new-tokens", "16", "--methods",
                                                "threshold,simsd,spiffy", *more]))
        rec = last_json(capsys.readouterr().out)
        return status, rec, {r["method"]: r for r in rec["results"]}
    status, rec, rows = run("--temperature", "0.8")
    assert status == 0 and rec["temperature"] == 0.8 and rec["lossless_ok"]
    assert all(r["same_fraction"] == 1 for r in rows.values()) and len(rows) == 3
    greedy = run()[2]
    assert rows["threshold"]["output_digests"] != greedy["threshold"]["output_digests"]


def test_compile_drafter_compiles_the_drafter_alone(monkeypatch, capsys):
    """--compile drafter: the drafter compiled ("auto"; dynamo's eager backend here, to be
    quick), the target left eager, and the same tokens as with nothing compiled."""
    calls = []

    def compile_model(m, how):
        calls.append((m.config.n_layer, how))
        fast.compile_dynamic(m, backend="eager")
    monkeypatch.setattr(fast, "compile_model", compile_model)
    out, _ = sample.main(spec="simsd", max_new_tokens=16, compile="drafter")
    eager, _ = sample.main(spec="simsd", max_new_tokens=16)
    drafter_layers = cli.load(cli.DEFAULT_DRAFTER)[0].config.n_layer
    assert calls == [(drafter_layers, "auto")] and out == eager


def test_bench_compile_drafter_adds_a_row_with_the_drafter_compiled(monkeypatch, capsys):
    """--compile drafter: each drafted method twice, its drafter eager and compiled (dynamo's
    eager backend here), both compared with threshold (the target is eager in both), the
    second with the first, in the same run; methods without a drafter once."""
    monkeypatch.setattr(fast, "compile_model", lambda m, how: fast.compile_dynamic(m, backend="eager"))
    status = bench.main(**bench.parse_args(["--prompts", "2", "--max-new-tokens", "8", "--methods",
                                            "threshold,simsd", "--compile", "drafter"]))
    rec = last_json(capsys.readouterr().out)
    by = {r["method"]: r for r in rec["results"]}
    simsd, compiled = by["simsd-lossless+threshold"], by["simsd-lossless+threshold (drafter compiled)"]
    assert status == 0 and len(by) == 3 and compiled["same_as"] == "threshold" and compiled["same_fraction"] == 1
    assert compiled["speedup_vs_eager"] == pytest.approx(compiled["tokens_per_s"] / simsd["tokens_per_s"])
    assert compiled["nfe"] == simsd["nfe"] and compiled["draft_fwd_per_token"] == simsd["draft_fwd_per_token"]
    assert rec["dynamo"]["graphs_after_warmup"] == 0


def test_bench_exits_nonzero_when_a_lossless_method_differs(monkeypatch, capsys):
    real = decoder.spiffy_generate

    def broken(*args, **kw):
        out, stats = real(*args, **kw)
        return out[:-1] + [out[-1] + 1], stats
    monkeypatch.setattr(decoder, "spiffy_generate", broken)
    status = bench.main(**bench.parse_args(["--quick", "--methods", "plain,spiffy"]))
    assert status == 1 and not last_json(capsys.readouterr().out)["lossless_ok"]


def test_bench_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown method"):
        bench.main(methods=("plain", "medusa"))
    with pytest.raises(FileNotFoundError, match="--data file"):
        bench.main(methods=("plain",), data=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        bench.main(methods=("plain",), data=str(bad))
    with pytest.raises(ValueError, match="block-size"):
        bench.parse_args(["--block-size", "4,x"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no GPU"):
            bench.main(device="cuda")


def test_short_training_run_lowers_held_out_loss_and_saves_a_loadable_model(tmp_path):
    data = tiny_corpus(tmp_path)
    kw = dict(preset="tiny", data_dir=data, out_dir=tmp_path / "m", iters=60, batch_size=8,
              seq_len=64, eval_every=30, eval_batches=2, ckpt_dir=tmp_path / "ck")
    train.main(**kw)
    log = json.loads((tmp_path / "m" / "train_log.json").read_text())
    for key in ("val_arith/B4", "val_arith/B32"):
        assert log[-1][key] < log[0][key] - 0.5, key
    model = checkpoint.from_pretrained(tmp_path / "m")
    assert model.config.block_sizes == objective.BLOCK_SIZES
    with pytest.raises(ValueError, match="another model config"):
        train.main(**dict(kw, preset="drafter", ckpt_dir=tmp_path / "ck", resume=True, iters=61))


def test_training_loss_keeps_every_tensor_on_the_data_device(monkeypatch):
    """A tensor made without device= lands on the CPU, which on a GPU mixes devices; the meta
    device shows the same mistake on a CPU-only machine (CPU and meta tensors do not mix)."""
    from torch.fx.experimental import _config as fx_config
    monkeypatch.setattr(fx_config, "meta_nonzero_assume_all_nonzero", True)  # x[mask] on meta
    with torch.device("meta"):
        model = Transformer(ModelConfig(**PRESETS["tiny"]))
    x0 = torch.zeros(2, 64, dtype=torch.long, device="meta")
    for B in objective.BLOCK_SIZES:
        assert objective.bd3lm_loss(model, x0, B, torch.Generator()).device.type == "meta"


def test_mark_prompts_keeps_each_question_clean_and_pads_each_answer():
    tok = load_tokenizer(DEFAULT_TARGET)
    text = tok.encode("ROMEO. Answer me, I pray.") + [tok.eos_id]     # no "Answer:": noised
    ps = problems(3, "test")
    docs = [tok.encode(f"Question: {p['question']}\nAnswer: {p['answer']}") + [tok.eos_id] for p in ps]
    data = np.array(text + [i for d in docs for i in d], np.uint16)
    padded, keep = objective.mark_prompts(data, tok.encode("Answer:"), tok.eos_id, pad=5)
    assert not keep[:len(text)].any() and (padded[:len(text)] == text).all()
    start = len(text)
    for p, d in zip(ps, docs):
        k = keep[start:start + len(d)]
        assert k[:k.sum()].all() and tok.decode(d[:k.sum()]) == f"Question: {p['question']}\nAnswer:"
        assert (padded[start:start + len(d)] == d).all() and not keep[start + k.sum():start + len(d) + 5].any()
        assert (padded[start + len(d):start + len(d) + 5] == tok.eos_id).all()   # the padding
        start += len(d) + 5
    assert start == len(padded)
    x0 = torch.arange(256).view(2, 128)
    xt, masked = objective.noise(x0, 8, -1, torch.Generator().manual_seed(0), keep=x0 % 3 == 0)
    assert not masked[x0 % 3 == 0].any() and masked.any() and (xt[masked] == -1).all()


def test_after_answer_counts_only_steps_with_the_answer_complete():
    from decode import DecodeRule
    from training.report import AfterAnswer
    rule = AfterAnswer(DecodeRule(3, 4), eos_id=2)
    logits = torch.randn(4, 10)
    for block, counted in (([3, 3, 3, 3], 0), ([5, 2, 3, 3], 1), ([3, 2, 3, 3], 0), ([2, 3, 3, 3], 1),
                           ([5, 6, 3, 3], 0)):
        before = rule.steps
        assert rule(logits, torch.tensor(block), 0).tolist() == DecodeRule(3, 4)(logits, torch.tensor(block), 0).tolist()
        assert rule.steps - before == counted, block


def test_finetune_starts_from_stage_one_and_lowers_the_answer_loss(tmp_path):
    data = tiny_corpus(tmp_path)
    kw = dict(preset="tiny", data_dir=data, out_dir=tmp_path / "m", batch_size=8, seq_len=64,
              eval_every=30, eval_batches=2)
    with pytest.raises(FileNotFoundError, match="train it first"):
        train.main(**kw, finetune=True, ckpt_dir=tmp_path / "ck2")
    with pytest.raises(ValueError, match="not of this preset's shape"):
        train.main(**dict(kw, out_dir=DEFAULT_TARGET), finetune=True, ckpt_dir=tmp_path / "ck2")
    train.main(**kw, iters=60, ckpt_dir=tmp_path / "ck1")
    train.main(**kw, iters=60, ckpt_dir=tmp_path / "ck2", finetune=True)
    log = json.loads((tmp_path / "m" / "train_log.json").read_text())
    one, two = log[:3], log[3:]
    assert [r.get("stage") for r in log] == [None] * 3 + ["finetune"] * 3
    assert two[0]["val_answer/B4"] < one[0]["val_answer/B4"] - 0.5   # began where stage one ended
    assert two[-1]["val_answer/B4"] < two[0]["val_answer/B4"]


class Interrupted(Exception):
    pass


def test_interrupted_save_keeps_the_previous_checkpoint_and_resume_continues(tmp_path, monkeypatch):
    data = tiny_corpus(tmp_path)
    ck, out = tmp_path / "ck", tmp_path / "m"
    kw = dict(preset="tiny", data_dir=data, out_dir=out, iters=12, batch_size=2, seq_len=32,
              eval_every=4, eval_batches=1, ckpt_dir=ck)
    real_save, saved = torch.save, []

    def save(obj, f, *args, **kwargs):   # the third checkpoint dies half-way through the file
        if len(saved) == 2:
            Path(f).write_bytes(b"half a checkpoint")
            raise Interrupted
        saved.append(obj["iter"])
        return real_save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(Interrupted):
        train.main(**kw)
    monkeypatch.undo()
    assert saved == [0, 4] and sorted(p.name for p in ck.iterdir()) == ["ckpt.pt"]
    assert torch.load(ck / "ckpt.pt")["iter"] == 4            # the previous one, whole
    assert not (out / "model.safetensors").exists()
    train.main(**kw, resume=True)
    ckpt = torch.load(ck / "ckpt.pt")
    assert ckpt["iter"] == 12 and [r["iter"] for r in ckpt["log"]] == [0, 4, 8, 11]
    checkpoint.from_pretrained(out)


def test_train_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        train.main(preset="huge")
    with pytest.raises(FileNotFoundError, match="prepare.py"):
        train.main(preset="tiny", data_dir=tmp_path)
    data = tiny_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train.main(preset="tiny", data_dir=data, resume=True, ckpt_dir=tmp_path / "none")
    (data / "train.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="missing or empty"):
        train.main(preset="tiny", data_dir=data, out_dir=tmp_path / "m", ckpt_dir=tmp_path / "ck")


def test_bench_with_random_positions_still_finds_the_lossless_methods_lossless(capsys):
    """Every run gets a generator seeded alike, so random positions agree across methods."""
    status = bench.main(**bench.parse_args(["--quick", "--strategy", "random", "--methods",
                                            "plain,simsd-lossless,spiffy+static"]))
    rec = last_json(capsys.readouterr().out)
    assert status == 0 and all(r["same_fraction"] == 1 for r in rec["results"])


def test_speed_of_light_runs_on_a_tiny_preset(capsys):
    """bench.py --speed-of-light's figures, on the tiny preset: every forward row (B = 4, 8, 32
    and B = 4 with 8x the cache allocated) timed against the floor, each decoder's verification
    forward, and the loop."""
    from measure.sol import speed_of_light
    r = speed_of_light("tiny", cache_len=64, iters=2, new_tokens=8)
    assert [(f["block_size"], f["cache_rows"]) for f in r["forwards"]] == \
        [(4, 256), (8, 256), (32, 256), (4, 512)]
    assert all(f["forward_ms"] > 0 and f["x_floor"] > 0 for f in r["forwards"])
    assert [(v["decoder"], v["queries"], v["logit_rows"]) for v in r["verification"]] == \
        [("plain", 4, 4), ("plain", 4, 3), ("plain", 4, 2), ("plain", 4, 1), ("spiffy", 36, 19),
         ("simsd", 16, 10)]                                              # logits where masked
    assert all(v["forward_ms"] > 0 and v["round_x_plain"] > 0 for v in r["verification"])
    assert r["loop"]["nfe"] > 1 and r["loop"]["x_forwards"] > 0
    assert "the floor" in capsys.readouterr().out


def test_plot_draws_a_bench_json_and_refuses_bad_input(tmp_path, monkeypatch):
    import sys
    from tools import plot
    rows = [dict(method=m, block_size=B, tokens_per_target_fwd=t * B / 4, tokens_per_s=100 * t)
            for m, t in (("threshold", 2.0), ("spiffy", 1.5)) for B in (4, 8)]
    bench_json = tmp_path / "b.json"
    bench_json.write_text(json.dumps(dict(results=rows, device="cpu", date="2026-12-01")))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no bench results"):
        plot.plot(tmp_path / "empty.json", tmp_path / "p.png")
    with pytest.raises(ValueError, match="no directory"):
        plot.plot(bench_json, tmp_path / "no" / "p.png")
    try:
        import matplotlib  # noqa: F401
        plot.plot(bench_json, tmp_path / "p.png")
        assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    except ImportError:
        pass
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # as if it were not installed
    with pytest.raises(ValueError, match=r"plot.py needs matplotlib \(pip install matplotlib\)"):
        plot.plot(bench_json, tmp_path / "q.png")
    assert not (tmp_path / "q.png").exists()


def test_a_sweep_gives_rows_only_to_the_methods_that_read_its_setting(capsys):
    """--sweep gamma: a row a gamma for the drafter's methods; one row, and one line saying
    so, for a method that drafts without gamma (its counts were the same at every gamma)."""
    target = Transformer(ModelConfig(**PRESETS["tiny"]))
    plan = bench.plan_runs(["simsd-lossless", "simsd-trajectory"], (4, 8), target, target, None,
                           "gamma", (), None, None, ROOT / "no-tables-here", dict(table="none"))   # no tables
    assert sorted(name for name, B in plan if B == 4) == [
        "simsd-lossless(gamma=1)", "simsd-lossless(gamma=2)", "simsd-lossless(gamma=4)",
        "simsd-trajectory"]
    assert capsys.readouterr().out == "--sweep gamma: simsd-trajectory does not read it (one row)\n"


def test_every_command_line_the_readme_table_names_is_accepted():
    """Each row of the README's results table named by sample.py's flags (`--spec simsd`,
    `--verify temporal --accept paper`) is a command line sample.py accepts."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(--[^`]+)`", readme.split("## Results", 1)[1].split("\n## ", 1)[0], re.M)
    assert len(rows) >= 3
    for flags in rows:
        argv = ([] if flags.startswith("--spec") else ["--spec", "simsd"]) + flags.split()
        args = sample.parse_args(argv)
        cli.check_flags(args["spec"], "cpu", None, None, 8, None, *cli.split_flags(
            {k: v for k, v in args.items() if k in {*cli.RULE_FLAGS, *cli.METHOD_FLAGS}}))
