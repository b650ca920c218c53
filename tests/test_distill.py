"""Distilling a drafter from its target (train.py --distill, objective.distill_loss): the
loss is the KL to the target on exactly bd3lm_loss's noised input, it lowers the held-out KL,
bad input is one line before training, and a resume keeps the same target and weight."""
import json
import math
import shutil
import sys
import types
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import torch.nn as nn

from loading import checkpoint
import mask as masks
from training import objective
import train
from loading import util
from conftest import make_model, tiny_corpus

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "models" / "target" / "tokenizer.model"


def target_dir(d, name="target", seed=0, **config):
    """A peaky random target checkpoint with the shipped tokenizer: the tiny preset at the
    corpus's vocabulary (2048 pieces, mask 3, EOS 2), trained for every block size."""
    config = dict(dict(vocab=2048, block_sizes=objective.BLOCK_SIZES, max_seq_len=1024), **config)
    model = make_model(n_layer=1, seed=seed, gain=2.0, **config)
    t = d / name
    checkpoint.save_pretrained(model, t, torch.float32)
    shutil.copy(TOKENIZER, t)
    return t


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(tmp dir, data dir, target dir), once for the module."""
    d = tmp_path_factory.mktemp("distill")
    return d, tiny_corpus(d), target_dir(d)


def run(d, data, name, **kw):
    """train.main, a tiny drafter from scratch (stage one) -> its train_log.json."""
    kw = dict(dict(preset="tiny", data_dir=data, out_dir=d / name, ckpt_dir=d / f"{name}-ck", batch_size=8,
                   seq_len=64, eval_every=15, eval_batches=2, warmup=0, iters=30), **kw)
    train.main(**kw)
    return json.loads((d / name / "train_log.json").read_text())


def test_distillation_lowers_the_held_out_kl_to_the_target(pair):
    d, data, target = pair
    log = run(d, data, "distilled", distill=str(target))
    plain = run(d, data, "plain", distill=str(target), distill_weight=0.0)   # the data alone, KL logged
    assert [r["iter"] for r in log] == [0, 15, 29] and "train_kl" not in log[0]
    for split in ("val_text", "val_arith", "val_answer"):
        for B in objective.BLOCK_SIZES:
            key = f"kl/{split}/B{B}"
            assert log[-1][key] < 0.8 * log[0][key], key        # it falls
            assert log[-1][key] < plain[-1][key] - 0.1, key     # and more than from the data alone
    assert log[-1]["train_kl"] < log[1]["train_kl"]
    assert plain[0]["val_arith/B4"] == log[0]["val_arith/B4"]     # both began at the same model


def test_with_weight_0_the_loss_is_bd3lm_loss_exactly():
    model, teacher = make_model(), make_model(seed=1)
    x0 = torch.randint(4, 97, (2, 64), generator=torch.Generator().manual_seed(0))
    keep, weight = x0 % 5 == 0, torch.where(x0 % 3 == 0, 4.0, 1.0)
    for B in objective.BLOCK_SIZES:
        for autocast in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                g1, g2 = torch.Generator().manual_seed(B), torch.Generator().manual_seed(B)
                plain = objective.bd3lm_loss(model, x0, B, g1, keep, weight)
                loss, kl = objective.distill_loss(model, teacher, x0, B, g2, keep, weight, distill_weight=0.0)
            assert torch.equal(loss, plain) and kl > 0
            assert torch.equal(g1.get_state(), g2.get_state())    # the teacher draws nothing


class Fixed(nn.Module):
    """A stand-in model whose logits are the same row at every position."""

    def __init__(self, row):
        super().__init__()
        self.config = types.SimpleNamespace(mask_token_id=0)
        self.row = nn.Parameter(torch.tensor(row))

    def forward(self, idx, pos, mask=None):
        return self.row.expand(*idx.shape, -1)


def test_the_distill_loss_is_the_kl_computed_by_hand():
    """Target p = (1/2, 1/4, 1/4), drafter uniform: KL = 1/2 ln(3/2) + 1/2 ln(3/4), the
    cross-entropy to any data ln 3, and the KL's gradient (q - p) / n on each of n rows; none
    reaches the target."""
    teacher, model = Fixed([math.log(0.5), math.log(0.25), math.log(0.25)]), Fixed([0.0, 0.0, 0.0])
    x0 = torch.tensor([[1, 2, 1, 1, 2, 2, 1, 2]])
    by_hand = 0.5 * math.log(1.5) + 0.5 * math.log(0.75)
    loss, kl = objective.distill_loss(model, teacher, x0, 4, torch.Generator().manual_seed(0), distill_weight=0.25)
    assert kl.item() == pytest.approx(by_hand, rel=1e-6) and by_hand == pytest.approx(0.0588915, rel=1e-5)
    assert loss.item() == pytest.approx(0.75 * math.log(3) + 0.25 * by_hand, rel=1e-6)
    loss, _ = objective.distill_loss(model, teacher, x0, 4, torch.Generator().manual_seed(0))
    loss.backward()                        # the row is every position's: its gradient sums (q - p) / n
    torch.testing.assert_close(model.row.grad, torch.tensor([1 / 3 - 0.5, 1 / 3 - 0.25, 1 / 3 - 0.25]))
    assert teacher.row.grad is None


@torch.no_grad()
def test_the_distill_loss_matches_an_explicit_kl_on_tiny_models():
    """Per masked position, sum p_t (log p_t - log p_s) in float64, on the same x_t."""
    import mask as masks
    model, teacher = make_model(), make_model(seed=1)
    x0 = torch.randint(4, 97, (2, 32), generator=torch.Generator().manual_seed(2))
    loss, kl = objective.distill_loss(model, teacher, x0, 8, torch.Generator().manual_seed(3))
    xt, masked = objective.noise(x0, 8, model.config.mask_token_id, torch.Generator().manual_seed(3))
    mask = masks.dense_mask(objective.bd3lm_training(8, 32), 64, 64)
    pos = torch.arange(32).repeat(2)
    p_t, p_s = (m(torch.cat([xt, x0], 1), pos, mask=mask)[:, :32].double().softmax(-1) for m in (teacher, model))
    rows = [(p_t[b, i] * (p_t[b, i].log() - p_s[b, i].log())).sum().item()
            for b in range(2) for i in range(32) if masked[b, i]]
    assert len(rows) > 10 and kl.item() == pytest.approx(sum(rows) / len(rows), rel=1e-4)
    assert loss.item() == kl.item()                                  # weight 1: the KL alone


def one_line_error(capsys, **kw):
    """train.main's bad input as the command line reports it (util.run): -> that line."""
    with pytest.raises(SystemExit) as e:
        util.run(lambda: train.main(**kw))
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""                           # nothing printed before
    line = str(e.value.code)
    assert line.startswith("error: ") and "\n" not in line
    return line


def bad_target(case, d, target):
    """The --distill directory of a case (the good target where the case is another flag)."""
    if case == "missing":
        return d / "nowhere"
    if case in ("not-a-checkpoint", "broken-weights"):
        t = shutil.copytree(target, d / "t") if case == "broken-weights" else d / "t"
        t.mkdir(exist_ok=True)
        (t / ("model.safetensors" if case == "broken-weights" else "notes.txt")).write_bytes(b"not weights")
        return t
    if case == "another-tokenizer":                  # 40 pieces of its own (test_cli's recipe)
        t = target_dir(d)
        (d / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 50)
        spm.SentencePieceTrainer.train(input=str(d / "text.txt"), model_prefix=str(t / "tokenizer"),
                                       vocab_size=40, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=-1,
                                       eos_id=2, user_defined_symbols=["<|mask|>"], minloglevel=2)
        return t
    config = {"another-vocabulary": dict(vocab=4096), "another-mask-id": dict(mask_token_id=5),
              "another-block-sizes": dict(block_sizes=(4, 8)), "too-short": dict(max_seq_len=32)}
    return target_dir(d, **config[case]) if case in config else target


@pytest.mark.parametrize("case, expected", [
    ("missing", "--distill: checkpoint directory"),
    ("not-a-checkpoint", "is not a checkpoint directory (no config.json)"),
    ("another-vocabulary", "has vocabulary size 4096, the drafter 2048"),
    ("another-mask-id", "has mask token id 5, the drafter 3"),
    ("another-block-sizes", "was trained for block size(s) [4, 8], the drafter trains at [4, 8, 32]"),
    ("another-tokenizer", "has another tokenizer than the data's"),
    ("too-short", "reads 32 positions, fewer than --seq-len 64"),
    ("broken-weights", "--distill: "),
    ("the-target-preset", "--distill trains a drafter from a target; not the target preset"),
    ("weight-1.5", "--distill-weight must be in [0, 1], got 1.5"),
    ("weight-without-distill", "--distill-weight needs --distill"),
])
def test_bad_distill_input_is_one_line_before_training(case, expected, pair, tmp_path, capsys):
    _, data, target = pair
    kw = dict(preset="tiny", data_dir=data, out_dir=tmp_path / "m", ckpt_dir=tmp_path / "ck", seq_len=64,
              distill=str(bad_target(case, tmp_path, target)))
    kw.update({"the-target-preset": dict(preset="target"), "weight-1.5": dict(distill_weight=1.5),
               "weight-without-distill": dict(distill=None, distill_weight=0.5)}.get(case, {}))
    assert expected in one_line_error(capsys, **kw)
    assert not (tmp_path / "m").exists() and not (tmp_path / "ck").exists()   # nothing written


def test_the_command_line_reports_it_in_one_line(tmp_path):
    import subprocess
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--preset", "target", "--distill", "x"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "error: --distill trains a drafter from a target; not the target preset itself\n"


def test_resume_keeps_the_same_target_and_weight(pair, tmp_path, capsys):
    d, data, target = pair
    kw = dict(preset="tiny", data_dir=data, out_dir=tmp_path / "m", ckpt_dir=tmp_path / "ck", batch_size=2,
              seq_len=32, eval_every=2, eval_batches=1, iters=2, distill=str(target), distill_weight=0.5)
    train.main(**kw)
    assert torch.load(tmp_path / "ck" / "ckpt.pt")["distill"]["weight"] == 0.5
    other = target_dir(tmp_path, "other", seed=7)
    capsys.readouterr()
    more = dict(kw, iters=4, resume=True)
    line = one_line_error(capsys, **dict(more, distill=str(other)))
    assert f"was trained with --distill {target.resolve()} (weights sha256" in line and str(other.resolve()) in line
    assert "--distill-weight 0.5, not" in one_line_error(capsys, **dict(more, distill_weight=0.7))
    assert "0.5, not without --distill" in one_line_error(capsys, **dict(more, distill=None, distill_weight=None))
    assert torch.load(tmp_path / "ck" / "ckpt.pt")["iter"] == 2                  # untouched
    copy = shutil.copytree(target, tmp_path / "copy")                           # the same weights elsewhere
    train.main(**dict(more, distill=str(copy)))
    assert torch.load(tmp_path / "ck" / "ckpt.pt")["iter"] == 4


def test_resume_refuses_to_distill_a_run_trained_without(pair, tmp_path, capsys):
    _, data, target = pair
    kw = dict(preset="tiny", data_dir=data, out_dir=tmp_path / "m", ckpt_dir=tmp_path / "ck", batch_size=2,
              seq_len=32, eval_every=2, eval_batches=1, iters=2)
    train.main(**kw)
    capsys.readouterr()
    line = one_line_error(capsys, **dict(kw, iters=4, resume=True, distill=str(target)))
    assert "was trained without --distill, not with --distill" in line


# ---- tools/distill.py: a drafter for a given target from a JSONL of prompts

def prompts_file(d, n=12):
    path = d / "prompts.jsonl"
    path.write_text("".join(json.dumps(dict(question=f"Question: {k} apples and {k + 2} pears?\nAnswer:")) + "\n"
                            for k in range(n)))
    return path


def test_distill_py_trains_a_drafter_toward_its_targets_answers_and_resumes(tmp_path):
    from tools import distill
    target, drafter = target_dir(tmp_path), target_dir(tmp_path, "drafter", seed=5)
    prompts, out = prompts_file(tmp_path), tmp_path / "distilled"
    kw = dict(target=target, drafter=drafter, prompts=prompts, out=out, max_new_tokens=8, iters=12,
              batch_size=4, eval_every=6, lr=3e-3)
    distill.main(**kw)
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 12 and all(a["answer"] for a in answers)
    log = json.loads((out / "distill_log.json").read_text())
    for B in objective.BLOCK_SIZES:
        assert log[-1][f"kl/held_out/B{B}"] < log[0][f"kl/held_out/B{B}"], B
    model, _ = __import__("cli").load(out)                     # a checkpoint sample.py reads
    assert (out / "tokenizer.model").is_file() and model.config.vocab_size == 2048
    with pytest.raises(ValueError, match="--resume to go on"):
        distill.main(**kw)
    distill.main(**dict(kw, iters=18, resume=True))           # goes on from iteration 12
    assert json.loads((out / "distill_log.json").read_text())[-1]["iter"] == 17


def test_answers_go_on_from_an_earlier_runs_and_refuse_other_prompts(tmp_path):
    """answers.jsonl copied from a run whose prompts began these is gone on from, as a restart
    is, to the answers a fresh run gives; answers to other prompts are refused by line."""
    from tools import distill
    from loading import util
    teacher, _, tok, _ = distill.pair(target_dir(tmp_path), target_dir(tmp_path, "drafter", seed=5), "cpu")
    read = lambda n: util.read_prompts(prompts_file(tmp_path, n), "--prompts")   # noqa: E731
    first = distill.answers(teacher, tok, read(3), tmp_path / "a.jsonl", 8, False)
    more = distill.answers(teacher, tok, read(5), tmp_path / "a.jsonl", 8, False)
    assert more[:3] == first and more == distill.answers(teacher, tok, read(5), tmp_path / "b.jsonl", 8, False)
    with pytest.raises(ValueError, match="a.jsonl line 1 is not the answer to --prompts line 1"):
        distill.answers(teacher, tok, read(5)[1:], tmp_path / "a.jsonl", 8, False)
    with pytest.raises(ValueError, match="line 4 is not the answer to --prompts line 4"):
        distill.answers(teacher, tok, read(3), tmp_path / "a.jsonl", 8, False)   # more answers than prompts


def test_distill_py_refuses_a_target_of_another_vocabulary(tmp_path):
    from tools import distill
    target, drafter = target_dir(tmp_path, vocab=4096), target_dir(tmp_path, "drafter", seed=5)
    with pytest.raises(ValueError, match="tokenizer|vocabulary"):
        distill.main(target=target, drafter=drafter, prompts=prompts_file(tmp_path), out=tmp_path / "o")
    assert not (tmp_path / "o" / "answers.jsonl").exists()


def test_teacher_ordered_noise_masks_what_the_target_is_least_sure_of():
    """tools/distill.py --teacher-order: a block's masked positions are its round(t B) (at least one)
    the target is least sure of with the whole answer masked, as in its own decoding states
    (what it reveals last is still masked); the prompt is never masked; without an order the
    draws are the random ones, unchanged."""
    g = lambda: torch.Generator().manual_seed(3)   # noqa: E731
    teacher = make_model(n_layer=1, seed=0, gain=2.0, vocab=97)
    x0 = torch.randint(4, 97, (3, 32), generator=g())
    keep = torch.zeros(3, 32, dtype=torch.bool)
    keep[:, :6] = True
    for B in (4, 8):
        _, masked, _ = objective.noised_forward(teacher, x0, B, g(), keep, teacher_order=teacher)
        with torch.no_grad():                        # the target with the whole answer masked
            mask = masks.dense_mask(objective.bd3lm_training(B, 32), 64, 64, "cpu")
            conf = teacher(torch.cat([x0.masked_fill(~keep, 3), x0], 1), torch.arange(32).repeat(2), mask=mask)
        conf = conf[:, :32].log_softmax(-1).gather(-1, x0[..., None]).squeeze(-1).masked_fill(keep, math.inf)
        t = torch.rand(3, 32 // B, 1, generator=g()) * (1 - 1e-3) + 1e-3
        for b in range(3):
            for k in range(32 // B):
                at = slice(k * B, (k + 1) * B)
                lowest = conf[b, at].argsort()[:max(1, round(float(t[b, k, 0]) * B))]
                want = torch.zeros(B, dtype=torch.bool).index_fill_(0, lowest, True) & ~keep[b, at]
                assert torch.equal(masked[b, at], want), (B, b, k)
        assert not masked[keep].any() and masked.any()
    _, masked, _ = objective.noised_forward(teacher, x0, 4, g(), keep)
    t = (torch.rand(3, 8, 1, generator=(r := g())) * (1 - 1e-3) + 1e-3).expand(-1, -1, 4).reshape(3, 32)
    assert torch.equal(masked, (torch.rand(3, 32, generator=r) < t) & ~keep)
