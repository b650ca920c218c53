"""The quality figures of docs/results.md (`python train.py --report`, or
`python training/report.py --target DIR` for another pair): held-out masked-token loss
(`evaluate`, which training logs too), greedy accuracy on held-out problems with how often an
answer's people and things come from its question, and drafter/target agreement."""
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import mask as masks  # noqa: E402
from cli import load  # noqa: E402
from decode import DecodeRule, generate  # noqa: E402
from training.objective import BLOCK_SIZES, Batches, bd3lm_loss, bd3lm_training  # noqa: E402
from training.tasks import entities_copied, extract_answer, problems  # noqa: E402

# the decoding rules the report measures: name -> DecodeRule keywords
RULES = {"one token a step": {}, "threshold 0.9": dict(strategy="low_confidence_dynamic", threshold=0.9)}


def val_splits(data_dir, tok):
    """The held-out splits `evaluate` scores: text, arithmetic, and arithmetic answers alone."""
    d = Path(data_dir)
    return dict(val_text=(d / "val_text.bin", ()), val_arith=(d / "val_arith.bin", ()),
                val_answer=(d / "val_arith.bin", tuple(tok.encode("Answer:"))))


@torch.no_grad()
def evaluate(model, splits, seq_len, batch_size, n_batches, seed=0):
    """Held-out masked-token loss per (split, block size), with fixed windows and noise.
    splits: name -> (token file, ids that end a prompt; () to noise every token)."""
    model.eval()
    out, dev = {}, model.embed.weight.device
    for name, (path, answer_ids) in splits.items():
        batches = Batches(path, seq_len, seed, answer_ids=answer_ids, eos_id=model.config.eos_token_id)
        xs = [batches(batch_size) for _ in range(n_batches)]
        for B in BLOCK_SIZES:
            g = torch.Generator(dev).manual_seed(seed)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type in ("cpu", "cuda")):
                out[f"{name}/B{B}"] = sum(bd3lm_loss(model, x.to(dev), B, g, keep.to(dev)).item()
                                          for x, keep, _ in xs) / n_batches
    model.train()
    return out


@torch.no_grad()
def agreement(target, drafter, path, block_size, answer_ids=(), seq_len=256, n=16, seed=0):
    """Greedy agreement of drafter and target on the first denoising step of each block (the
    block masked, clean blocks before it), per token and whole blocks. With answer_ids, the
    question of each arithmetic document stays clean and only answer positions count, as
    when decoding an answer."""
    x0, prompt, _ = Batches(path, seq_len, seed, answer_ids=answer_ids, eos_id=target.config.eos_token_id)(n)
    xt = torch.where(prompt, x0, target.config.mask_token_id)
    mask = masks.dense_mask(bd3lm_training(block_size, seq_len), 2 * seq_len, 2 * seq_len)
    pos = torch.arange(seq_len).repeat(2)
    guess = [m(torch.cat([xt, x0], 1), pos, mask=mask)[:, :seq_len].argmax(-1) for m in (target, drafter)]
    same, counted = (guess[0] == guess[1]).view(-1, block_size), ~prompt.view(-1, block_size)
    blocks = counted.any(-1)
    return (same[counted].float().mean().item(),
            (same | ~counted).all(-1)[blocks].float().mean().item())


class AfterAnswer:
    """A DecodeRule that counts its steps taken once the answer is complete: the block holds
    EOS and no mask before it, so only positions after the EOS are left to fill."""

    def __init__(self, rule, eos_id):
        self.rule, self.eos_id, self.steps = rule, eos_id, 0

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def __call__(self, logits, block, step, generator=None):
        b = block.tolist()
        self.steps += self.eos_id in b and self.mask_id not in b[:b.index(self.eos_id)]
        return self.rule(logits, block, step, generator)


def share(k, n):
    return f"{k}/{n} = {k / n:.1%}" if n else "0/0"


def decode_problems(model, tok, tasks, rule, desc):
    """Decode tasks, (prompt ids, question, result) each, greedily with rule (an AfterAnswer)
    -> the figures line: accuracy, tokens per forward, the share of forwards after the answer,
    and among the answers that name people (things) those whose people (things) all come from
    the question (tasks.entities_copied)."""
    ok = tokens = nfe = 0
    copies = {"people": [0, 0], "things": [0, 0]}       # kind -> [from the question, named any]
    for ids, question, result in tqdm(tasks, desc=desc, leave=False):
        out, st = generate(model, ids, 64, rule, eos_id=tok.eos_id)
        text = tok.decode(out)
        ok, tokens, nfe = ok + (extract_answer(text) == result), tokens + len(out), nfe + st["nfe"]
        for kind, from_question in entities_copied(question, text).items():
            if from_question is not None:
                copies[kind][0] += from_question
                copies[kind][1] += 1
    return (f"accuracy {share(ok, len(tasks))}, {tokens / nfe:.2f} tokens per forward, "
            f"{rule.steps / nfe:.1%} of forwards after the answer, "
            f"people from the question {share(*copies['people'])}, things {share(*copies['things'])}")


def report(target_dir="models/target", drafter_dir="models/drafter", data_dir="data", n_problems=200):
    """The quality figures in the README: held-out masked-token loss; greedy accuracy on
    held-out problems of plain decoding (one token a step) and of the threshold rule (0.9),
    with its tokens per forward, the share of its forwards spent after the answer was
    complete and the answers' people and things from the question; drafter/target
    agreement; at B = 4, 8 and 32."""
    (target, tok), (drafter, _) = load(target_dir), load(drafter_dir)
    models = dict(target=target, drafter=drafter)
    val = val_splits(data_dir, tok)
    for path, _ in val.values():
        Batches(path, 256, 0, target.config.vocab_size)  # checked before the first figure
    tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["question"], p["result"])
             for p in problems(n_problems, "test")]
    for name, m in models.items():
        print(name, " ".join(f"{k}={v:.3f}" for k, v in evaluate(m, val, 256, 16, 8).items()))
        for B in BLOCK_SIZES:
            for kind, kw in RULES.items():
                rule = AfterAnswer(DecodeRule(m.config.mask_token_id, B, **kw), tok.eos_id)
                figures = decode_problems(m, tok, tasks, rule, f"{name} B={B} {kind}")
                print(f"{name} greedy B={B} {kind}: {figures}")
    for B in BLOCK_SIZES:
        for split, (path, answer_ids) in val.items():
            tok_agree, block_agree = agreement(target, drafter, path, B, answer_ids)
            print(f"agreement B={B} {split}: per token {tok_agree:.3f}, whole block {block_agree:.3f}")


if __name__ == "__main__":
    from loading import util
    ap = util.ArgumentParser(description="The quality figures of a target/drafter pair "
                             "(python train.py --report: the embedded pair).")
    ap.add_argument("--target", default="models/target", help="target checkpoint directory")
    ap.add_argument("--drafter", default="models/drafter", help="drafter checkpoint directory")
    ap.add_argument("--data-dir", default="data", help="tools/prepare.py's output")
    ap.add_argument("--problems", type=int, default=200, help="held-out problems to decode")
    a = ap.parse_args()
    util.run(lambda: util.check_positive(problems=a.problems)
             or report(a.target, a.drafter, a.data_dir, a.problems))
