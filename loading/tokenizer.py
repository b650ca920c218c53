"""Tokenizers for speculative block-diffusion decoding: one small interface, two kinds.

load_tokenizer(dir) picks the kind from the files in dir:
  - tokenizer.model -> "sentencepiece": this project's own models, with a "<|mask|>" piece;
  - vocab.json or tokenizer.json -> "bpe": Qwen2/Qwen3 byte-level BPE (SDAR's tokenizer), read
    offline and run by tiktoken. GPT-2-style vocabularies list tokens in merge order, so a token's
    id is also its merge rank (checked on load). Ids match HF `tokenizers`, with one known gap: NFC
    here uses Python's Unicode tables and HF's are Unicode 9, so text holding one of the 99
    combining marks added since (e.g. U+089B next to another mark) can normalise differently.
check_same_tokenizer refuses a drafter/target pair whose tokenizers differ, saying what differs.

References: GPT-2 byte-level BPE (Radford et al., 2019); Qwen2 technical report (pre-tokenizer
regex, NFC, ChatML); SDAR (<|MASK|> = 151669); tiktoken; SentencePiece (Kudo & Richardson, 2018).

Usage:
    tok = load_tokenizer("checkpoints/sdar-1.7b-chat", mask_id=151669)
    ids = tok.encode(tok.apply_chat_template("What is 2 + 2?"))
    check_same_tokenizer(load_tokenizer("checkpoints/drafter"), tok)
"""
import hashlib
import os
import re
import unicodedata

import sentencepiece
import tiktoken

from loading.util import read_json

# Qwen2's pre-tokenizer: GPT-4's regex, except that digits are split one by one (\p{N}).
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_MASK_TOKEN, SPM_MASK_PIECE = "<|MASK|>", "<|mask|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table: printable bytes stand for themselves, the other 68
    (controls, space, ...) become chr(256 + n) in byte order, so every token is visible text."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    table, shifted = {}, 0
    for b in range(256):
        table[b] = chr(b) if b in printable else chr(256 + shifted)
        shifted += b not in printable
    return table


class Tokenizer:
    """Shared part. Subclasses define encode / decode, kind, the special ids, vocab_size,
    `added` (added-token text -> id) and `_pieces` (id -> bytes, the whole vocabulary), and
    may set `chat_template` (Jinja source) and `special_tokens` (e.g. eos_token -> its text)."""
    chat_template, special_tokens = None, {}

    def apply_chat_template(self, user_text: str) -> str:
        """One user turn, ending where the assistant's answer starts: the checkpoint's own
        template rendered as transformers renders it (messages, add_generation_prompt=True,
        the special tokens), or, for a checkpoint without one, ChatML (SDAR's and Qwen's
        format) as the fallback; `chat_template is None` tells the caller which."""
        if self.chat_template is not None:
            return render_chat_template(self.chat_template, [{"role": "user", "content": user_text}],
                                        **self.special_tokens)
        if "<|im_start|>" not in self.added:
            raise ValueError(f"{self.kind} tokenizer has no chat template (no chat_template, no "
                             f"<|im_start|> token)")
        return f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"

    def vocab_hash(self) -> str:
        """SHA-256 of the whole vocabulary as length-prefixed (id, bytes) records; cached."""
        if not hasattr(self, "_vocab_hash"):
            h = hashlib.sha256()
            for i, piece in sorted(self._pieces.items()):
                h.update(i.to_bytes(4, "little") + len(piece).to_bytes(4, "little") + piece)
            self._vocab_hash = h.hexdigest()
        return self._vocab_hash

    def fingerprint(self) -> str:
        """Hash of kind, vocab size, vocabulary and special ids: equal means interchangeable."""
        fields = [self.kind, self.vocab_size, self.vocab_hash(), self.eos_id, self.mask_id, self.pad_id]
        return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


class SentencePieceTokenizer(Tokenizer):
    kind, added = "sentencepiece", {}  # no added tokens, hence no chat template

    def __init__(self, model_file: str, eos_id=None, mask_id=None):
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        except (RuntimeError, OSError) as e:  # sentencepiece's own message does not name the file
            raise ValueError(f"{model_file} is not a readable sentencepiece model: {e}") from None
        found = self.sp.piece_to_id(SPM_MASK_PIECE)  # a missing piece maps to unk_id
        if mask_id is None and self.sp.id_to_piece(found) != SPM_MASK_PIECE:
            raise ValueError(f"{model_file}: sentencepiece model has no {SPM_MASK_PIECE!r} piece")
        self.mask_id = found if mask_id is None else mask_id
        self.eos_id = self.sp.eos_id() if eos_id is None else eos_id
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else None  # -1 means "none"
        self.vocab_size = self.sp.get_piece_size()
        self._pieces = {i: self.sp.id_to_piece(i).encode() for i in range(self.vocab_size)}

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)  # plain ids: no bos / eos added

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])  # accepts lists and tensors


class BPETokenizer(Tokenizer):
    kind = "bpe"

    def __init__(self, name, ranks: dict[bytes, int], added: dict[str, int], pattern, eos_id, mask_id, pad_id):
        self.added, self.eos_id, self.mask_id, self.pad_id = added, eos_id, mask_id, pad_id
        regular = set(ranks.values())  # an added token may repeat a regular one (same id and bytes)
        specials = {t: i for t, i in added.items() if i not in regular}
        self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        self._pieces = {i: b for b, i in ranks.items()} | {i: t.encode() for t, i in specials.items()}
        self.vocab_size = max(self._pieces) + 1
        # As in HF: added tokens are cut out of the raw text first (leftmost, longest first), and
        # NFC is applied only to the text between them, so it can never create or break one.
        alternatives = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
        self._split = re.compile(f"({alternatives})") if added else None

    def encode(self, text: str) -> list[int]:
        parts = self._split.split(text) if self._split else [text]
        ids = []
        for k, part in enumerate(parts):  # odd parts are the captured added tokens
            if k % 2:
                ids.append(self.added[part])
            elif part:
                ids.extend(self._enc.encode_ordinary(unicodedata.normalize("NFC", part)))
        return ids

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids])  # a cut character becomes U+FFFD


def render_chat_template(source: str, messages, **special_tokens) -> str:
    """A Jinja chat template rendered the way transformers' apply_chat_template does: a
    sandbox, trim_blocks and lstrip_blocks, loop controls, its `raise_exception`, `tojson`
    and `strftime_now` helpers, and add_generation_prompt=True. A template that does not
    compile or render raises a one-line ValueError."""
    import datetime
    import json

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    try:
        return env.from_string(source).render(messages=messages, tools=None, documents=None,
                                              add_generation_prompt=True, **special_tokens)
    except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError) as e:
        raise ValueError(f"the chat_template does not render: {type(e).__name__}: {e}") from None


def _chat_template(path: str, config: dict):
    """The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's
    `chat_template` (a string, or a list of named templates: the "default" one); None if none."""
    file = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(file):
        with open(file, encoding="utf-8") as f:
            return f.read()
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{os.path.join(path, 'tokenizer_config.json')}: chat_template must be text")
    return template


def _read_json(path: str, name: str):
    """The JSON object in path/name, or None when the file does not exist."""
    file = os.path.join(path, name)
    return read_json(file) if os.path.isfile(file) else None


def _merges(path: str, tok_json: dict) -> list[str]:
    """BPE merges as "a b" strings: merges.txt, else tokenizer.json (strings or [a, b] pairs)."""
    file = os.path.join(path, "merges.txt")
    if not os.path.isfile(file):
        return [m if isinstance(m, str) else " ".join(m) for m in tok_json.get("model", {}).get("merges", [])]
    with open(file, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#version")]


def _added_tokens(path: str, tok_json: dict, config: dict) -> dict[str, int]:
    """Added tokens from the three files HF may use, merged; an id or text defined twice raises."""
    sources = {"tokenizer.json": [(t["content"], t["id"]) for t in tok_json.get("added_tokens", [])],
               "tokenizer_config.json": [(t["content"], int(i))
                                         for i, t in config.get("added_tokens_decoder", {}).items()],
               "added_tokens.json": list((_read_json(path, "added_tokens.json") or {}).items())}
    added, owner = {}, {}
    for name, pairs in sources.items():
        for text, i in pairs:
            if added.get(text, i) != i or owner.get(i, text) != text:
                raise ValueError(f"{os.path.join(path, name)}: added token {text!r} (id {i}) conflicts")
            added[text], owner[i] = i, text
    return added


def _load_bpe(path: str, eos_id=None, mask_id=None) -> BPETokenizer:
    tok_json = _read_json(path, "tokenizer.json") or {}
    config = _read_json(path, "tokenizer_config.json") or {}
    vocab = _read_json(path, "vocab.json") or tok_json.get("model", {}).get("vocab")
    if not vocab:
        raise ValueError(f"{path}: no vocabulary (no vocab.json, and tokenizer.json has no model.vocab)")
    if not isinstance(vocab, dict) or not all(type(i) is int and i >= 0 for i in vocab.values()):
        raise ValueError(f"{path}: the vocabulary must map token strings to ids >= 0")
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    try:
        ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items()}
    except KeyError as err:
        raise ValueError(f"{path}: vocabulary is not byte-level BPE (character {err})") from None
    merged_ids = [vocab.get(m.replace(" ", ""), -1) for m in _merges(path, tok_json)]  # "Ġ" is the space
    if any(x >= y for x, y in zip(merged_ids, merged_ids[1:])):  # tiktoken merges by rank = id
        raise ValueError(f"{path}: merges do not create tokens in id order, so rank = id fails")
    pre = tok_json.get("pre_tokenizer") or {}
    splits = [p for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"]
    pattern = splits[0]["pattern"]["Regex"] if splits else QWEN2_PATTERN
    added = _added_tokens(path, tok_json, config)

    def token_id(key, default=None):  # config values are strings or {"content": ...} dicts
        value = config.get(key) or default
        value = value.get("content") if isinstance(value, dict) else value
        return added.get(value, ranks.get(value.encode())) if value else None

    eos_id = token_id("eos_token", "<|endoftext|>") if eos_id is None else eos_id
    mask_id = added.get(BPE_MASK_TOKEN) if mask_id is None else mask_id
    name = f"bpe-{os.path.basename(os.path.normpath(path))}"
    tok = BPETokenizer(name, ranks, added, pattern, eos_id, mask_id, token_id("pad_token"))
    tok.chat_template = _chat_template(path, config)
    tok.special_tokens = {k: v.get("content") if isinstance(v, dict) else v for k, v in config.items()
                          if k.endswith("_token") and isinstance(v, (str, dict))}   # bos_token, ...
    return tok


def load_tokenizer(path, eos_id: int | None = None, mask_id: int | None = None) -> Tokenizer:
    """Tokenizer from the files in directory `path`; eos_id / mask_id override the files' values."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
        return SentencePieceTokenizer(os.path.join(path, "tokenizer.model"), eos_id, mask_id)
    if any(os.path.isfile(os.path.join(path, f)) for f in ("vocab.json", "tokenizer.json")):
        return _load_bpe(path, eos_id, mask_id)
    looked_for = "tokenizer.model, vocab.json, tokenizer.json"
    raise FileNotFoundError(f"no tokenizer files in {path}: looked for {looked_for}")


def check_same_tokenizer(a: Tokenizer, b: Tokenizer, names=("drafter", "target")) -> None:
    """Raise a one-line ValueError naming both tokenizers and everything that differs."""
    fields = [("kind", a.kind, b.kind), ("vocab size", a.vocab_size, b.vocab_size),
              ("vocabulary hash", a.vocab_hash()[:12], b.vocab_hash()[:12]),
              ("mask id", a.mask_id, b.mask_id), ("eos id", a.eos_id, b.eos_id), ("pad id", a.pad_id, b.pad_id)]
    diffs = [f"{what} {x} vs {y}" for what, x, y in fields if x != y]
    if diffs:
        raise ValueError(f"{names[0]} and {names[1]} tokenizers differ: " + "; ".join(diffs))
