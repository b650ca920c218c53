"""Train a small block-diffusion LM with the BD3-LM / SDAR objective (docs/design.md, section 5).

Each batch holds random windows of L clean tokens x_0 from the corpus. A block size B is
drawn per batch from {4, 8, 32}, so one checkpoint decodes at all three; in every block of B
tokens each token is masked with probability t ~ U(eps, 1) (one t per block), giving x_t.
The model reads [x_t ; x_0] (2L tokens, both halves at positions 0..L-1) under the BD3-LM
mask (mask.bd3lm_training): noisy block b sees itself and the clean blocks before it, which is
exactly what it sees when decoding block b against a KV cache of clean blocks. The loss is the
cross-entropy on the masked positions of x_t.

Two stages. The first applies that objective to every token, from random weights. The second
(--finetune) starts from the first's model and keeps the question of every arithmetic document
clean, noising only its answer (and the text, as before): at decoding the prompt is never
masked, so the second stage spends the whole arithmetic signal on what decoding asks for. Each
answer is followed by 31 more EOS (SDAR's fine-tuning pads responses with EOS the same way), so
that decoding fills the rest of an answer's last block at once.

Distillation (--distill TARGET_DIR, for a drafter, either stage): the frozen target reads the
same [x_t ; x_0] as the drafter (eval mode, no grad, the same bf16 autocast), and the loss on
the masked positions becomes (1 - W) * the cross-entropy to the data (with --copy-weight's
weights) + W * KL(p_target || p_drafter), W = --distill-weight (default 1: pure distillation,
since SimSD accepts a drafted token where it is the target's choice, not the data's). The log
holds the held-out KL (kl/<split>/B<B>, on the windows and noise of the held-out losses) and
the mean training KL since the last evaluation (train_kl).

On CPU the attention is SDPA with the dense mask (CPU FlexAttention has no backward) under
bf16 autocast; on CUDA the model is compiled, FlexAttention with it. Every flag and input
file is checked before anything is printed or written; checkpoints and outputs are written
to a temporary file and renamed, so an interrupted save leaves the previous checkpoint whole.

    python tools/prepare.py             # builds data/ (corpus + tokenizer), once
    python train.py --preset target        # -> models/target (config.json, weights, tokenizer)
    python train.py --preset drafter       # -> models/drafter
    python train.py --preset target --finetune    # stage two, models/target in place
    python train.py --preset drafter --finetune
    python train.py --preset drafter --finetune --distill models/target   # drafter from target
    python train.py --report                   # held-out loss, accuracy, drafter agreement
    python train.py --preset target --resume   # continue from out/target/ckpt.pt
                                               # (training checkpoints live in out/<preset>,
                                               # out/<preset>-finetune for stage two)
"""
import argparse, hashlib, json, math, shutil, time, warnings
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from cli import check_device, load
from loading import checkpoint, util
from loading.tokenizer import load_tokenizer
from model import ModelConfig, Transformer
from training import report
from training.objective import BLOCK_SIZES, Batches, bd3lm_loss, distill_loss, entity_ids, held_out_kl

# model shapes and schedules (the drafter ~5x smaller than the target); finetune: stage two's
PRESETS = {
    "target": dict(model=dict(n_layer=4, n_embd=256, n_head=4, n_kv_head=2, head_dim=64, intermediate_size=768),
                   iters=2500, lr=1.5e-3, warmup=200, finetune=dict(iters=1400, lr=5e-4, warmup=50)),
    "drafter": dict(model=dict(n_layer=2, n_embd=128, n_head=2, n_kv_head=1, head_dim=64, intermediate_size=384),
                    iters=1200, lr=3e-3, warmup=200, finetune=dict(iters=2000, lr=2e-3, warmup=50)),
    "tiny": dict(model=dict(n_layer=1, n_embd=32, n_head=2, n_kv_head=1, head_dim=16, intermediate_size=64),
                 iters=40, lr=3e-3, warmup=200, finetune=dict(iters=20, lr=3e-3, warmup=5)),
}


def lr_at(it, iters, lr, warmup):
    """Linear warm-up, then cosine decay to 10%."""
    if it < warmup:
        return lr * (it + 1) / warmup
    progress = (it - warmup) / max(1, iters - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def check_args(preset, iters, batch_size, seq_len, lr, warmup, eval_every, eval_batches, threads, device,
               distill=None, distill_weight=None):
    """Every flag, before any file is read."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if distill is not None and preset == "target":
        raise ValueError("--distill trains a drafter from a target; not the target preset itself")
    if distill_weight is not None and distill is None:
        raise ValueError("--distill-weight needs --distill TARGET_DIR")
    if distill_weight is not None and not 0 <= distill_weight <= 1:
        raise ValueError(f"--distill-weight must be in [0, 1], got {distill_weight}")
    util.check_positive(iters=iters, batch_size=batch_size, seq_len=seq_len, eval_every=eval_every,
                        eval_batches=eval_batches, threads=threads)
    step = math.lcm(*BLOCK_SIZES)
    if seq_len % step:
        raise ValueError(f"--seq-len must be a multiple of {step}, so that every block size "
                         f"{BLOCK_SIZES} tiles it; got {seq_len}")
    if lr is not None and not lr > 0:
        raise ValueError(f"--lr must be > 0, got {lr}")
    if warmup is not None and warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    check_device(device)


def check_block_weights(text):
    """--block-weights "1,1,4": one weight >= 0 per block size in BLOCK_SIZES, not all 0."""
    if text is None:
        return None
    try:
        w = [float(v) for v in str(text).split(",")]
    except ValueError:
        w = []
    if len(w) != len(BLOCK_SIZES) or min(w) < 0 or sum(w) <= 0 or not all(map(math.isfinite, w)):
        raise ValueError(f"--block-weights must be {len(BLOCK_SIZES)} numbers >= 0, not all 0, one per "
                         f"block size {BLOCK_SIZES} (e.g. 1,1,4); got {text!r}")
    return torch.tensor(w)


def check_data(data_dir, seq_len):
    """tools/prepare.py's output: meta.json, the tokenizer (copied next to the model at the end) and
    the three token files, checked before training, not at the first evaluation. -> meta"""
    meta_file = Path(data_dir) / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{meta_file} not found: run `python tools/prepare.py` first")
    meta = util.read_json(meta_file)
    for key in ("vocab_size", "mask_id", "eos_id"):
        if type(meta.get(key)) is not int:
            raise ValueError(f"{meta_file}: {key} must be an integer, got {meta.get(key)!r}")
    if not (Path(data_dir) / "tokenizer.model").is_file():
        raise FileNotFoundError(f"no tokenizer.model in {data_dir} (run tools/prepare.py)")
    tok = load_tokenizer(data_dir)
    if tok.vocab_size > meta["vocab_size"]:
        raise ValueError(f"{data_dir}: tokenizer has {tok.vocab_size} ids, meta.json's "
                         f"vocab_size is {meta['vocab_size']}")
    for split in ("train", "val_text", "val_arith"):
        Batches(Path(data_dir) / f"{split}.bin", seq_len, 0, meta["vocab_size"])
    return meta, tok


def load_teacher(path, weight, config, tok, seq_len, device):
    """--distill's target: a checkpoint of the drafter's vocabulary (tokenizer included) and
    mask token, trained for every block size of BLOCK_SIZES. -> (frozen model, what a resume
    checks: its path, the SHA-256 of its weights, the weight W (None: 1))"""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"--distill: checkpoint directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--distill: {path} is not a checkpoint directory (no config.json)")
    try:
        teacher, teacher_tok = load(path, device)
    except (ValueError, OSError) as e:
        raise ValueError(f"--distill: {e}") from None
    c = teacher.config
    for what, mine, theirs in (("vocabulary size", config.vocab_size, c.vocab_size),
                               ("mask token id", config.mask_token_id, c.mask_token_id)):
        if mine != theirs:
            raise ValueError(f"--distill: the target in {path} has {what} {theirs}, the drafter {mine}")
    if not set(BLOCK_SIZES) <= set(c.block_sizes or (c.block_size,)):
        raise ValueError(f"--distill: the target in {path} was trained for block size(s) "
                         f"{list(c.block_sizes or (c.block_size,))}, the drafter trains at {list(BLOCK_SIZES)}")
    if teacher_tok.vocab_hash() != tok.vocab_hash():
        raise ValueError(f"--distill: the target in {path} has another tokenizer than the data's")
    if c.max_seq_len < seq_len:
        raise ValueError(f"--distill: the target in {path} reads {c.max_seq_len} positions, "
                         f"fewer than --seq-len {seq_len}")
    return teacher.requires_grad_(False), teacher_info(path, weight)


def teacher_info(path, weight=None):
    """What a resume checks of a distillation: the target's path, its weights' SHA-256, W."""
    digest, path = hashlib.sha256(), Path(path)
    for shard in checkpoint.find_shards(path):
        digest.update((path / shard).read_bytes())
    return dict(target=str(path.resolve()), sha256=digest.hexdigest(), weight=1.0 if weight is None else weight)


def save_checkpoint(path, model, opt, it, config, log, distill=None):
    """Through a temporary file: a save interrupted half-way leaves the previous one whole."""
    with util.atomic_write(path) as tmp:
        torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict(), iter=it,
                        config=asdict(config), log=log, distill=distill), tmp)


def distilled(info):
    """A distillation as a resume error names it: target path, weights, --distill-weight."""
    return (f"with --distill {info['target']} (weights sha256 {info['sha256'][:12]}) --distill-weight "
            f"{info['weight']:g}" if info else "without --distill")


def load_checkpoint(path, model, opt, config, iters, device, distill=None):
    """Resume model and opt from path: readable, of this model config and distillation (the
    same target weights and weight, or none), not done. -> (iter, log)"""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    try:
        with warnings.catch_warnings():    # a foreign pickle warns before failing
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=device)
    except Exception as e:  # torch.load fails in many ways on a damaged file
        raise ValueError(f"--resume: cannot read {path} ({type(e).__name__})") from None
    if not (isinstance(ckpt, dict) and {"model", "optimizer", "iter", "config", "log"} <= set(ckpt)):
        raise ValueError(f"--resume: {path} is not a training checkpoint")
    if ckpt["config"] != asdict(config):
        raise ValueError(f"--resume: {path} was trained with another model config")
    then, same = ckpt.get("distill"), lambda d: d and (d["sha256"], d["weight"])  # no entry: none
    if same(then) != same(distill):
        raise ValueError(f"--resume: {path} was trained {distilled(then)}, not {distilled(distill)}")
    if ckpt["iter"] >= iters:
        raise ValueError(f"--resume: {path} has already done {ckpt['iter']} of {iters} iterations")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    return ckpt["iter"], ckpt["log"]


def main(preset="target", data_dir="data", out_dir=None, iters=None, batch_size=16, seq_len=256,
         lr=None, warmup=None, weight_decay=0.1, grad_clip=1.0, eval_every=250, eval_batches=4,
         seed=1337, resume=False, device="cpu", threads=None, ckpt_dir=None, finetune=False,
         copy_weight=1.0, block_weights=None, distill=None, distill_weight=None):
    """Stage one, or with finetune stage two from stage one's model in out_dir (module doc);
    with distill (a target's directory), distilled from that target (module doc)."""
    check_args(preset, iters, batch_size, seq_len, lr, warmup, eval_every, eval_batches, threads, device,
               distill, distill_weight)
    block_weights = check_block_weights(block_weights)
    stage = PRESETS[preset]["finetune"] if finetune else PRESETS[preset]
    iters, lr, warmup = iters or stage["iters"], lr or stage["lr"], stage["warmup"] if warmup is None else warmup
    data_dir, out_dir = Path(data_dir), Path(out_dir or f"models/{preset}")
    ckpt_file = Path(ckpt_dir or f"out/{preset}{'-finetune' if finetune else ''}") / "ckpt.pt"
    meta, tok = check_data(data_dir, seq_len)
    util.check_writable(out_dir, "--out-dir", folder=True)
    util.check_writable(ckpt_file.parent, "checkpoint directory", folder=True)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config, model, opt, stage_one_log = build(preset, meta, data_dir, finetune and out_dir, device, lr, weight_decay)
    teacher, info = (None, None) if distill is None else load_teacher(distill, distill_weight, config, tok,
                                                                      seq_len, device)
    start, log = load_checkpoint(ckpt_file, model, opt, config, iters, device, info) if resume else (0, [])
    for m in (model, teacher) if model.embed.weight.is_cuda else ():
        if m is not None:
            m.compile()  # FlexAttention is only fast compiled; the state_dict keeps its names
    val = report.val_splits(data_dir, tok)
    batches = Batches(data_dir / "train.bin", seq_len, seed + start, meta["vocab_size"],
                      val["val_answer"][1] if finetune else (), tok.eos_id, max(BLOCK_SIZES) - 1,
                      entity_ids(tok), copy_weight)
    print(f"{preset}: {sum(t.numel() for t in model.parameters()) / 1e6:.2f}M parameters, {iters} "
          f"iterations of {batch_size}x{seq_len} tokens, block sizes {BLOCK_SIZES}")
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_file.parent.mkdir(parents=True, exist_ok=True)
    t0, save = time.time(), lambda it: save_checkpoint(ckpt_file, model, opt, it, config, log, info)
    kl = (lambda: held_out_kl(model, teacher, val, seq_len, batch_size, eval_batches)) if info else dict
    evaluate = lambda: {**report.evaluate(model, val, seq_len, batch_size, eval_batches), **kl()}
    fit(model, opt, batches, log, evaluate, save, start, iters, lr, warmup, batch_size, grad_clip,
        eval_every, seed, finetune, block_weights, info and (teacher, info["weight"]))
    save(iters)
    checkpoint.save_pretrained(model, out_dir, torch.float16)
    with util.atomic_write(out_dir / "tokenizer.model") as tmp:
        shutil.copy(data_dir / "tokenizer.model", tmp)
    with util.atomic_write(out_dir / "train_log.json") as tmp:
        tmp.write_text(json.dumps(stage_one_log + log, indent=1) + "\n")
    print(f"saved {out_dir} after {time.time() - t0:.0f} s")


def build(preset, meta, data_dir, stage_one, device, lr, weight_decay):
    """-> (config, model, AdamW, stage one's log); with stage_one (a folder), from its model."""
    try:
        config = checkpoint.check_config(ModelConfig(
            vocab_size=meta["vocab_size"], mask_token_id=meta["mask_id"], eos_token_id=meta["eos_id"],
            block_size=4, block_sizes=BLOCK_SIZES, max_seq_len=4096, **PRESETS[preset]["model"]))
    except ValueError as e:
        raise ValueError(f"{data_dir / 'meta.json'}: {e}") from None
    model, log = Transformer(config).to(device), []
    if stage_one:
        if not (Path(stage_one) / "config.json").is_file():
            raise FileNotFoundError(f"--finetune: no model in {stage_one}; train it first (without --finetune)")
        first, _ = load(stage_one)
        shape = lambda c: {k: v for k, v in asdict(c).items() if k not in ("max_seq_len", "block_size")}
        if shape(first.config) != shape(config):
            raise ValueError(f"--finetune: the model in {stage_one} is not of this preset's shape")
        model.load_state_dict(first.state_dict())
        log = Path(stage_one) / "train_log.json"
        log = [r for r in (util.read_json(log, list) if log.is_file() else []) if r.get("stage") != "finetune"]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                            weight_decay=weight_decay, fused=model.embed.weight.is_cuda)
    return config, model, opt, log


def fit(model, opt, batches, log, evaluate, save, start, iters, lr, warmup, batch_size, grad_clip,
        eval_every, seed, finetune, block_weights=None, distill=None):
    """Iterations start..iters-1: every eval_every and at the last (not again where a resume
    starts), log evaluate()'s losses and save(it); then an AdamW step at a random block size,
    each of BLOCK_SIZES equally likely or in proportion to block_weights. distill: (teacher,
    weight) for distill_loss, whose mean KL since the last log entry is logged as train_kl."""
    dev, seq_len = model.embed.weight.device, batches.seq_len
    g = torch.Generator(dev).manual_seed(seed + start)  # draws on the data's device
    bar, t0, tokens, kls = tqdm(range(start, iters), initial=start, total=iters), time.time(), 0, []
    for it in bar:
        if (it % eval_every == 0 or it == iters - 1) and not (log and log[-1]["iter"] == it):
            log.append(dict(stage="finetune", iter=it) if finetune else dict(iter=it))
            log[-1].update(seconds=time.time() - t0, **evaluate())
            if kls:
                log[-1]["train_kl"] = sum(kls) / len(kls)
                kls.clear()
            bar.write(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in log[-1].items()))
            save(it)
        for group in opt.param_groups:
            group["lr"] = lr_at(it, iters, lr, warmup)
        B = BLOCK_SIZES[torch.randint(len(BLOCK_SIZES), (1,), generator=g, device=g.device).item()
                        if block_weights is None else
                        torch.multinomial(block_weights.to(dev), 1, generator=g).item()]
        with torch.autocast(dev.type, dtype=torch.bfloat16):   # dev: cpu or cuda (check_device)
            x0, keep, weight = batches(batch_size)
            args = (x0.to(dev), B, g, keep.to(dev), weight.to(dev))
            loss, kl = (distill_loss(model, distill[0], *args, distill_weight=distill[1], ordered=distill[2:] == (True,)) if distill
                        else (bd3lm_loss(model, *args), None))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        tokens += batch_size * seq_len
        kls += [kl.item()] if distill else []
        bar.set_postfix(loss=f"{loss.item():.3f}", **({"kl": f"{kls[-1]:.3f}"} if distill else {}), B=B,
                        tok_s=f"{tokens / (time.time() - t0):.0f}")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="target", choices=list(PRESETS))
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--out-dir", default=None, help="default models/<preset>")
    ap.add_argument("--iters", type=int, default=None, help="default from the preset")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256, help=f"a multiple of {math.lcm(*BLOCK_SIZES)}")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="lr warm-up iterations (default from the preset)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--ckpt-dir", default=None, help="training checkpoints (default out/<preset>[-finetune])")
    ap.add_argument("--finetune", action="store_true", help="stage two: from the model in --out-dir, noise "
                    "only the answers of the arithmetic documents, EOS-padded (checkpoints in out/<preset>-finetune)")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="stage two: loss weight of the answer tokens the question holds (copies)")
    ap.add_argument("--block-weights", default=None, help=f"how often each block size {BLOCK_SIZES} is drawn, "
                    "e.g. 1,1,4 (default: equally)")
    ap.add_argument("--distill", default=None, metavar="TARGET_DIR", help="a drafter: distil it from "
                    "this target (frozen), the loss (1 - W) * cross-entropy + W * KL(target || drafter)")
    ap.add_argument("--distill-weight", type=float, default=None, metavar="W",
                    help="with --distill: W, in [0, 1] (default 1: the KL alone)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--report", action="store_true",
                    help="print the quality figures of models/target and models/drafter, no training")
    kw = vars(ap.parse_args())
    util.run(lambda: report.report(data_dir=kw["data_dir"]) if kw.pop("report") else main(**kw))
