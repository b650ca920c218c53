"""Distil a SimSD drafter for a given target from a JSONL of prompts (docs/results.md, "The
drafter distilled on the target's own answers").

SimSD keeps a drafted token where the target's own rule puts that token there, so a drafter
pays by predicting the target, not the data. Two parts, both on the target's own behaviour:
  sequence level  the target's answers: every prompt decoded once by the target with the
                  threshold rule at 0.9 (sample.py's default rule, greedy), saved as
                  <out>/answers.jsonl (a restart goes on after the last saved answer);
  token level     on [prompt ; the target's answer], each answer block noised as in training
                  (BD3-LM: t ~ U(0, 1) a block, the prompt never masked), the loss at the
                  masked positions (1 - W) * cross-entropy to the target's answer + W *
                  KL(p_target || p_drafter) (objective.distill_loss; W = --distill-weight).
The drafter starts from --drafter and is trained at every block size both were trained for
(in train.py's {4, 8, 32}); the result is a checkpoint directory (config.json, weights, and
the drafter's tokenizer files) that sample.py --drafter reads. Training checkpoints are
<out>/ckpt.pt; --resume goes on from the last. Every flag and both models are checked before
anything is decoded or written. On a GPU in practice (a real pair's target decodes every
prompt); tested here on a tiny random pair.

    python tools/distill.py --target ~/SDAR-8B-Chat --drafter ~/SDAR-1.7B-Chat --prompts mine.jsonl \\
        --chat --out ~/SDAR-1.7B-distilled --device cuda
    python tools/distill.py --prompts out/train_questions.jsonl --out out/drafter-seq   # embedded pair
"""
import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import checkpoint  # noqa: E402
import cli  # noqa: E402
from loading import util  # noqa: E402
from decode import generate  # noqa: E402
from training.objective import BLOCK_SIZES, distill_loss  # noqa: E402
from train import fit, load_checkpoint, save_checkpoint, teacher_info  # noqa: E402

SMOKE = ("--prompts {questions} --out {tmp}/drafter --max-new-tokens 8 --iters 1 --batch-size 2 "
         "--eval-every 1 --device cpu")
SMOKE_OUTPUT = r"saved the distilled drafter to .*/drafter after \d+ s"


def check_args(iters, batch_size, lr, distill_weight, max_new_tokens, eval_every):
    util.check_positive(iters=iters, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        eval_every=eval_every)
    if not lr > 0:
        raise ValueError(f"--lr must be > 0, got {lr}")
    if not 0 <= distill_weight <= 1:
        raise ValueError(f"--distill-weight must be in [0, 1], got {distill_weight}")


def pair(target_dir, drafter_dir, device):
    """-> (target, drafter, tokenizer, the block sizes both were trained for)."""
    target, tok = cli.load(target_dir, device)
    drafter = cli.load_drafter(drafter_dir, target, tok, [], device)
    sizes = lambda m: set(m.config.block_sizes or (m.config.block_size,))   # noqa: E731
    common = sorted(sizes(target) & sizes(drafter) & set(BLOCK_SIZES))
    if not common:
        raise ValueError(f"the target ({sorted(sizes(target))}) and the drafter "
                         f"({sorted(sizes(drafter))}) share no block size of {list(BLOCK_SIZES)}")
    return target.requires_grad_(False).eval(), drafter, tok, common


def answers(target, tok, prompts, path, max_new_tokens, chat):
    """The target's threshold-rule answer to each prompt, appended to `path` (JSONL of prompt
    and answer ids) as it goes; a restart reads what is there and goes on, as it does from an
    earlier run's answers copied in, whose prompts began these. -> [(prompt ids, answer ids +
    its stop id)]."""
    done = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    encode = lambda rec: tok.encode(tok.apply_chat_template(rec["question"]) if chat else rec["question"])  # noqa: E731
    for i, d in enumerate(done):
        if i >= len(prompts) or d["prompt"] != encode(prompts[i][1]):
            raise ValueError(f"{path} line {i + 1} is not the answer to --prompts line {i + 1}: "
                             "remove it, or choose another --out")
    rule = cli.make_rule(target, target.config.block_size, cli.THRESHOLD)
    stop = target.config.eos_token_id
    with path.open("a") as f:
        for _, rec in tqdm(prompts[len(done):], desc="the target's answers", initial=len(done),
                           total=len(prompts)):
            ids = encode(rec)
            out, _ = generate(target, ids, max_new_tokens, rule)
            done.append(dict(prompt=ids, answer=out + [stop]))
            f.write(json.dumps(done[-1]) + "\n")
            f.flush()
    return [(d["prompt"], d["answer"]) for d in done]


class Examples:
    """Batches of [prompt ; answer] padded with EOS to a multiple of 32 (every block size's
    grid, as decoding sees it: position 0 is the prompt's first token), the prompt kept
    clean; a sequence longer than max_len loses whole 32-token chunks from its start."""

    def __init__(self, pairs, eos_id, seed, max_len=1024):
        self.pairs, self.eos, self.rng, self.max_len = pairs, eos_id, torch.Generator().manual_seed(seed), max_len
        self.seq_len = max_len

    def __call__(self, batch_size):
        pick = torch.randint(len(self.pairs), (batch_size,), generator=self.rng).tolist()
        seqs = [(p + a, len(p)) for p, a in (self.pairs[i] for i in pick)]
        cut = [max(0, -(-(len(s) - self.max_len) // 32) * 32) for s, _ in seqs]
        L = max(-(-(len(s) - c) // 32) * 32 for (s, _), c in zip(seqs, cut))
        x = torch.full((batch_size, L), self.eos)
        keep = torch.zeros(batch_size, L, dtype=torch.bool)
        for i, ((s, n), c) in enumerate(zip(seqs, cut)):
            x[i, :len(s) - c] = torch.tensor(s[c:])
            keep[i, :max(0, n - c)] = True
        return x, keep, torch.ones(batch_size, L)


def main(target=cli.DEFAULT_TARGET, drafter=cli.DEFAULT_DRAFTER, prompts=None, out=None, chat=False, max_new_tokens=256,
         iters=600, batch_size=16, lr=2e-4, warmup=20, distill_weight=0.5, eval_every=100, seed=1337,
         device="cpu", threads=None, resume=False, held_out=0.05, teacher_order=False):
    check_args(iters, batch_size, lr, distill_weight, max_new_tokens, eval_every)
    cli.check_device(device)
    if prompts is None or out is None:
        raise ValueError("--prompts FILE.jsonl and --out DIR are both needed")
    records = util.read_prompts(prompts, "--prompts")
    out = Path(out)
    util.check_writable(out, "--out", folder=True)
    if (out / "ckpt.pt").is_file() and not resume:
        raise ValueError(f"{out / 'ckpt.pt'} exists: --resume to go on, or another --out")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    teacher, model, tok, sizes = pair(target, drafter, device)
    out.mkdir(parents=True, exist_ok=True)
    data = answers(teacher, tok, records, out / "answers.jsonl", max_new_tokens, chat)
    n_val = max(1, int(len(data) * held_out))
    val, train = Examples(data[:n_val], model.config.eos_token_id, seed), data[n_val:]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    info = teacher_info(target, distill_weight)
    start, log = load_checkpoint(out / "ckpt.pt", model, opt, model.config, iters, device, info) \
        if resume else (0, [])
    val_batches = [val(batch_size) for _ in range(4)]

    @torch.no_grad()
    def evaluate():             # KL(target || drafter) on held-out answers, per block size
        model.eval()
        g, res = torch.Generator(device).manual_seed(seed), {}
        for B in sizes:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                kls = [distill_loss(model, teacher, x.to(device), B, g, k.to(device))[1].item()
                       for x, k, _ in val_batches]
            res[f"kl/held_out/B{B}"] = sum(kls) / len(kls)
        model.train()
        return res
    weights = torch.tensor([float(B in sizes) for B in BLOCK_SIZES])
    save = lambda it: save_checkpoint(out / "ckpt.pt", model, opt, it, model.config, log, info)  # noqa: E731
    t0 = time.time()
    fit(model.train(), opt, Examples(train, model.config.eos_token_id, seed + start), log, evaluate,
        save, start, iters, lr, warmup, batch_size, 1.0, eval_every, seed, True, weights,
        (teacher, distill_weight, teacher_order))
    save(iters)
    checkpoint.save_pretrained(model, out, torch.float16 if device == "cpu" else torch.bfloat16)
    for f in Path(drafter).iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, out / f.name)
    (out / "distill_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"saved the distilled drafter to {out} after {time.time() - t0:.0f} s")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(cli.DEFAULT_TARGET), help="the target checkpoint (frozen)")
    ap.add_argument("--drafter", default=str(cli.DEFAULT_DRAFTER), help="the drafter to start from")
    ap.add_argument("--prompts", required=True, help="JSONL, one prompt a line in \"question\"")
    ap.add_argument("--out", required=True, help="the distilled drafter's directory (and its answers, checkpoints)")
    ap.add_argument("--chat", action="store_true", help="render prompts with the target's chat template")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="the longest answer the target writes")
    ap.add_argument("--iters", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--distill-weight", type=float, default=0.5, metavar="W",
                    help="the KL's share of the loss, in [0, 1]; the rest is cross-entropy to the target's answers")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--teacher-order", action="store_true", help="mask each block's positions the target is "
                    "least sure of (its decoding states), not random ones")
    util.run(lambda: main(**vars(ap.parse_args())))
