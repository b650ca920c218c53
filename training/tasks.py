"""The word problems the embedded pair learns and is measured on, and the bench's tasks: seeded
grade-school problems in GSM8K's answer format ("Tom has 7+5=12 apples. Then 12-3=9. #### 9"),
their answers read back, and the prompt sets bench.py and the calibration use (tools/prepare.py
writes the training corpus from the same problems)."""
import json
import operator
import random
import re
from pathlib import Path

from loading import util

ROOT = Path(__file__).resolve().parents[1]
SPLIT_SEEDS = {"train": 1234, "test": 4321}  # arithmetic problem streams

# ----------------------------------------------------------------------------- arithmetic problems
# Numbers are kept tiny on purpose so a small model can memorise every fact it needs:
# operands 2..12 (mostly 2..9), at most two operations, every result in 1..60,
# products only of factors 2..6, divisions exact with divisors 2..6.

NAMES = ["Tom", "Mia", "Sam", "Ava", "Leo", "Zoe", "Ben", "Lily", "Max", "Emma", "Omar", "Nina",
         "Raj", "Sara", "Ivan", "Lucy", "Kofi", "Anna", "Jack", "Maya", "Eli", "Rosa", "Finn", "Hana"]
WORDS = {"fruit": ["apples", "pears", "plums", "oranges", "lemons", "peaches"],
         "toy": ["marbles", "cars", "blocks", "dolls", "balls", "kites"],
         "snack": ["cookies", "candies", "grapes", "nuts", "crackers", "muffins"],
         "thing": ["stickers", "shells", "stamps", "cards", "coins", "rocks"],
         "item": ["pens", "books", "cups", "hats", "socks", "bowls"],
         "bake": ["cupcakes", "buns", "pies", "cakes", "rolls", "tarts"],
         "flower": ["roses", "tulips", "daisies", "lilies"],
         "gift": ["ball", "game", "book", "kite", "puzzle", "scarf"],
         "pet": ["dog", "cat", "rabbit", "parrot", "hamster"]}
# (operations, question, first answer sentence). {a} op1 {b} = x, then x op2 {c} = result.
# {e1}/{e2} are the written equations; a two-step answer gets " Then {e2}." appended.
TEMPLATES = [
    ("+", "{N} has {a} {fruit}. {M} gives {N} {b} more. How many {fruit} does {N} have now?", "{N} has {e1} {fruit}."),
    ("+", "{N} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {N} read?", "{N} read {e1} pages."),
    ("+", "{N} is {a} years old. How old will {N} be in {b} years?", "{N} will be {e1} years old."),
    ("+", "A walk to the park takes {a} minutes and the walk home takes {b} minutes. How long is the whole walk?", "The walk takes {e1} minutes."),
    ("+", "There are {a} {flower} in one vase and {b} in another. How many {flower} are there?", "There are {e1} {flower}."),
    ("-", "{N} had {a} {toy}. {N} lost {b} of them. How many {toy} are left?", "{N} has {e1} {toy} left."),
    ("-", "A bus had {a} people on it. At the stop, {b} people got off. How many people are on the bus now?", "There are {e1} people."),
    ("-", "{N} is {a} years old and {M} is {b} years old. How many years older is {N}?", "{N} is {e1} years older."),
    ("-", "{N} wants a {gift} that costs {a} dollars and has saved {b} dollars. How much more does {N} need?", "{N} needs {e1} dollars."),
    ("-", "A trip takes {a} hours. {N} has driven for {b} hours. How many hours are left?", "There are {e1} hours left."),
    ("*", "{N} buys {a} boxes with {b} {snack} in each box. How many {snack} does {N} have?", "{N} has {e1} {snack}."),
    ("*", "A car drives for {a} hours at {b} km per hour. How far does it go?", "It goes {e1} km."),
    ("*", "A {pet} eats {a} treats a day. How many treats does it eat in {b} days?", "It eats {e1} treats."),
    ("/", "{N} shares {a} {snack} equally among {b} friends. How many {snack} does each friend get?", "Each friend gets {e1} {snack}."),
    ("/", "{N} walked {a} km in {b} hours at a steady speed. How many km did {N} walk each hour?", "{N} walked {e1} km each hour."),
    ("/", "{a} children are split into teams of {b}. How many teams are there?", "There are {e1} teams."),
    ("+-", "{N} has {a} {fruit}, picks {b} more and then eats {c}. How many {fruit} are left?", "{N} has {e1} {fruit}."),
    ("+-", "A class has {a} boys and {b} girls. {c} children are away today. How many are in class?", "The class has {e1} children."),
    ("-+", "{N} had {a} dollars, spent {b} on a {gift} and then earned {c}. How much money does {N} have now?", "{N} had {e1} dollars left."),
    ("-+", "A shelf holds {a} books. {b} are taken out and {c} are put back. How many books are on the shelf?", "There are {e1} books."),
    ("++", "{N} found {a} {thing} on Monday, {b} on Tuesday and {c} on Wednesday. How many {thing} did {N} find?", "{N} found {e1} by Tuesday."),
    ("++", "{N} saved {a} dollars in May, {b} in June and {c} in July. How much did {N} save?", "{N} saved {e1} dollars by June."),
    ("--", "{N} had {a} dollars, spent {b} on lunch and {c} on a {gift}. How much money is left?", "After lunch {N} has {e1} dollars."),
    ("*+", "{N} buys {a} {item} at {b} dollars each and a bag for {c} dollars. How much does {N} spend?", "The {item} cost {e1} dollars."),
    ("*+", "{N} saves {a} dollars a week for {b} weeks and already had {c} dollars. How much does {N} have now?", "{N} saves {e1} dollars."),
    ("*+", "{N} plants {a} rows of {flower} with {b} in each row and {c} more by the gate. How many {flower} are planted?", "The rows have {e1} {flower}."),
    ("*+", "A cake needs {a} eggs. {N} bakes {b} cakes and uses {c} more eggs for pancakes. How many eggs are used?", "The cakes use {e1} eggs."),
    ("*-", "{N} bakes {a} trays of {bake} with {b} on each tray and gives away {c}. How many {bake} are left?", "{N} bakes {e1} {bake}."),
    ("*-", "{N} runs {a} km a day for {b} days. {M} runs {c} km less in total. How far does {M} run?", "{N} runs {e1} km."),
    ("+*", "{N} has {a} red boxes and {b} blue boxes. Each box holds {c} {toy}. How many {toy} are there?", "There are {e1} boxes."),
    ("-*", "{N} had {a} bags of {snack} and gave {b} away. Each bag has {c} {snack}. How many {snack} are left?", "{N} has {e1} bags left."),
    ("/+", "{a} {snack} are shared equally among {b} kids. Then each kid gets {c} more. How many does each kid have?", "Each kid gets {e1} {snack}."),
    ("/*", "{a} {fruit} are packed equally into {b} bags. {N} buys {c} bags. How many {fruit} does {N} get?", "Each bag has {e1} {fruit}."),
    ("*/", "{N} buys {a} packs of {b} {thing} and shares them equally among {c} friends. How many does each get?", "{N} has {e1} {thing}."),
    ("+/", "{N} has {a} {toy} and {M} has {b}. They put them equally into {c} bags. How many {toy} are in each bag?", "Together they have {e1} {toy}."),
    ("-/", "{N} had {a} {snack} and ate {b}. The rest are shared equally among {c} friends. How many does each get?", "{N} has {e1} {snack} left."),
]
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


def _small(rng):
    """An operand for + and -: 2..9 most of the time, sometimes 10..12."""
    return rng.randint(2, 9) if rng.random() < 0.85 else rng.randint(10, 12)


def _left_operand(rng, op):
    """The first number of a problem whose first operation is op."""
    if op == "*":
        return rng.randint(2, 6)
    if op == "/":
        return rng.randint(2, 6) * rng.randint(2, 9)   # a multiple of a small divisor
    return _small(rng)


def _right_operand(rng, op, left):
    """Pick b for `left op b` following the rules above, or None if no b fits."""
    if op == "*":
        return rng.randint(2, 6) if left <= 6 else None
    if op == "/":
        divisors = [d for d in range(2, 7) if left % d == 0]
        return rng.choice(divisors) if divisors else None
    b = _small(rng)
    return b if op == "+" or b < left else None


def make_problem(rng: random.Random, templates=TEMPLATES) -> dict:
    """One word problem: {"question", "answer" (worked, ends with "#### n"), "result"}."""
    ops, question, answer = rng.choice(templates)
    while True:                                   # rejection sampling until every rule holds
        x = _left_operand(rng, ops[0])
        nums, eqs = [x], []
        for op in ops:
            b = _right_operand(rng, op, x)
            if b is None or not 1 <= OPS[op](x, b) <= 60:
                break
            eqs.append(f"{x}{op}{b}={OPS[op](x, b)}")
            nums.append(b); x = OPS[op](x, b)
        else:
            break
    slots = {k: rng.choice(v) for k, v in WORDS.items()}
    slots["N"], slots["M"] = rng.sample(NAMES, 2)
    slots.update(a=nums[0], b=nums[1], c=nums[-1], e1=eqs[0], e2=eqs[-1])
    answer = answer.format(**slots) + (f" Then {eqs[1]}." if len(eqs) == 2 else "") + f" #### {x}"
    return {"question": question.format(**slots), "answer": answer, "result": x}


def _problem_stream(split):
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown problem split {split!r}, expected one of {list(SPLIT_SEEDS)}")
    rng = random.Random(SPLIT_SEEDS[split])
    while True:
        yield make_problem(rng)


def problems(n, split):
    """The first n problems of the reproducible "train" or "test" stream."""
    stream = _problem_stream(split)
    return [next(stream) for _ in range(n)]


def format_problem(p):
    return f"Question: {p['question']}\nAnswer: {p['answer']}"


def extract_answer(text):
    """The number after the last "####" in text, else the last number in text, else None.
    Thousands commas and a "$" are fine; "18.00" is 18, "2.50" is 2.5 (an int when whole)."""
    number = r"-?\d[\d,]*(?:\.\d+)?"
    after = re.findall(number, text.rsplit("####", 1)[1]) if "####" in text else []
    found = after[:1] or re.findall(number, text)[-1:]
    if not found:
        return None
    value = float(found[0].replace(",", ""))
    return int(value) if value.is_integer() else value


ENTITIES = {"people": set(NAMES), "things": {w for ws in WORDS.values() for w in ws}}


def entities_copied(question, answer):
    """Per kind (people, things): None if the answer names none, else whether every one it
    names is named in the question. The accuracy metric (the number) cannot see this."""
    q, a = (set(re.findall(r"[A-Za-z]+", s)) for s in (question, answer))
    return {kind: (a & words <= q) if a & words else None for kind, words in ENTITIES.items()}


# ----------------------------------------------------------------------------- benchmark tasks

TASKS = ("arith", "copy", "text")   # bench.py --tasks


def load_tasks(data, n, tok, chat, kind="arith"):
    """(prompt ids, expected answer or None) pairs: the first n of a GSM8K-style JSONL with
    "question" and "answer" (the answer's `#### N`, else its last number), or built here, by
    kind: "arith" held-out generated problems; "copy" each after its own worked answer (an
    answer that may repeat a long span of its prompt, where n-gram lookup pays); "text" open
    text, the held-out texts up to a speaker's line ("ROMEO."), no answer."""
    if kind not in TASKS:
        raise ValueError(f"unknown --tasks {kind!r}; choose from {', '.join(TASKS)}")
    if data is not None and kind != "arith":
        raise ValueError(f"--tasks {kind} builds its own prompts; --data gives arith problems")
    if kind == "text":
        items = speaker_prompts(n)
    elif data is None:
        items = [(f"Question: {p['question']}\nAnswer:", p["result"]) for p in problems(n, "test")]
        if kind == "copy":
            items = [(f"Question: {p['question']}\nAnswer: {p['answer']}\n\n{q}", a)
                     for p, (q, a) in zip(problems(n, "test"), items)]
    else:
        items = []
        for k, rec in util.read_prompts(data, "--data", ("question", "answer"), stop=n):
            items.append((rec["question"], extract_answer(str(rec["answer"]))))
            if items[-1][1] is None:
                raise ValueError(f"{data}:{k}: the answer must hold a number")
        if not items:
            raise ValueError(f"--data file {data} holds no problems")
    return [(tok.encode(tok.apply_chat_template(q) if chat else q), a) for q, a in items]


def speaker_prompts(n, path=ROOT / "data/val_text.jsonl", before=300):
    """n open-text prompts, one a held-out text: `before` characters of it, then the first
    speaker's line after them ("ROMEO.", in capitals)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (run tools/prepare.py)")
    items = []
    for line in path.read_text().splitlines():
        text = json.loads(line)["text"]
        for m in re.finditer(r"^[A-Z][A-Z ]{2,}\.\n", text, re.M):
            if m.start() >= before:
                items.append((text[m.start() - before:m.end()], None))
                break
    return items[:n]


def calibration_prompts(data, n_measured, tok, chat, note, n=50):
    """Prompts to calibrate a missing Spiffy graph on, never the ones measured: the
    training split's problems, or the --data file's lines after the first n_measured."""
    if data is None:
        note.append("missing Spiffy graphs are calibrated on training-split problems")
        return [tok.encode(f"Question: {p['question']}\nAnswer:") for p in problems(n, "train")]
    rest = util.read_prompts(data, "--data", start=n_measured, stop=n_measured + n)
    if not rest:
        raise ValueError(f"a Spiffy graph is missing and --data {data} has no lines left after the "
                         f"{n_measured} measured to calibrate it on: give fewer --prompts, or run "
                         f"`python tools/calibrate.py --data FILE` first")
    note.append(f"missing Spiffy graphs are calibrated on {data} lines {rest[0][0]}-{rest[-1][0]}, "
                f"which are not measured")
    return [tok.encode(tok.apply_chat_template(r["question"]) if chat else r["question"]) for _, r in rest]


def check(problem):
    """Recompute a problem: every equation in the answer is correct, uses numbers from the
    question or earlier results, stays within 0..60, and the last result is the answer."""
    known = {int(n) for n in re.findall(r"\d+", problem["question"])}
    eqs = re.findall(r"(\d+)([-+*/])(\d+)=(\d+)", problem["answer"])
    if not 1 <= len(eqs) <= 2:
        return False
    for a, op, b, c in map(lambda e: (int(e[0]), e[1], int(e[2]), int(e[3])), eqs):
        exact = op != "/" or a % b == 0
        if a not in known or b not in known or not exact or OPS[op](a, b) != c or not 0 <= c <= 60:
            return False
        known.add(c)
    return c == problem["result"] == extract_answer(problem["answer"])
