"""Whether the code a cost table was measured on and this checkout's are the same statements.

A cost table names the code it was measured on by measure/costs.code_hash: every top-level statement
of measure/costs.CODE but the imports, without docstrings or comments, in sorted order. Moving a
function between those files keeps the hash; renaming one changes it. This script compares a
commit's statements with the checkout's, after mapping the given renames back, so that a rename
can be shown to change nothing else before a table's hash is carried over to the new code.

    python experiments/code_moves.py --commit 8372e01 --files model.py,mask.py,decode.py,verify.py,\\
        speculate.py,fast.py --rename "walk_one_sync=walk;draft_one_sync=draft;return walk(logits, g, \\
        step, rule, generator, extra)=return walk_stepwise(logits, g, step, rule, generator, extra)"

2026-12-07: the one-sync walk and drafter moved from fast.py beside their references
(verify.walk_one_sync, speculate.draft_one_sync): the same statements as 8372e01's, True; the AMD
EPYC tables' hash carried over to d98024b1127e (docs/results.md, "Copies bought at their price").
"""
import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loading import util  # noqa: E402
from measure import costs  # noqa: E402

SMOKE = "--root {root} --commit HEAD"
SMOKE_OUTPUT = r"same statements: (True|False)"


def main(commit, files=costs.CODE, renames=(), root=costs.ROOT):
    then = {}
    for f in files:
        shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{f}"], capture_output=True, text=True)
        if shown.returncode:
            raise ValueError(f"git show {commit}:{f}: {shown.stderr.strip()}")
        then[f] = shown.stdout
    now = {}
    for f in costs.CODE:
        text = (Path(root) / f).read_text()
        for new, old in renames:
            text = text.replace(f"def {new}(", f"def {old}(") if new.isidentifier() else text.replace(new, old)
        now[f] = text
    a, b = Counter(costs.code_statements(then)), Counter(costs.code_statements(now))
    print(f"code hash now: {costs.code_hash(root)}; same statements: {a == b}")
    for s in (a - b):
        print(f"only in {commit}: {s.splitlines()[0]}")
    for s in (b - a):
        print(f"only now: {s.splitlines()[0]}")
    return a == b


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", required=True, help="the revision the tables were measured on")
    ap.add_argument("--files", default=",".join(costs.CODE), help="that revision's hashed files, comma-separated")
    ap.add_argument("--rename", default="", help="new=old pairs, semicolon-separated: a function's name, or any text")
    ap.add_argument("--root", default=str(costs.ROOT), help="the checkout")
    a = ap.parse_args()
    pairs = [tuple(p.split("=", 1)) for p in a.rename.split(";") if p]
    util.run(lambda: main(a.commit, a.files.split(","), pairs, a.root))
