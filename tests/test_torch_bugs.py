"""docs/torch_bugs/: each script shows a torch bug that a construct of the project avoids (the
comment there names the script). On the torch the bugs were seen on, each must still say
"reproduced" (exit 0); on another, either answer is fine, and one that says "not reproduced"
(exit 1) tells that the workaround may go. Each runs an inductor compile: about 20 s."""
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

SCRIPTS = sorted((ROOT / "docs" / "torch_bugs").glob("*.py"))
SEEN_ON = "2.13."


def test_every_script_is_named_where_its_bug_is_avoided():
    sources = "".join((ROOT / f).read_text() for f in ("mask.py", "fast.py"))
    assert len(SCRIPTS) == 2 and all(f"docs/torch_bugs/{p.name}" in sources for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_bug_is_reproduced_or_said_to_be_fixed(script):
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    said = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    if torch.__version__.startswith(SEEN_ON):
        assert run.returncode == 0 and said.startswith(f"reproduced on torch {torch.__version__}"), said
    else:
        assert (run.returncode, said.split()[0]) in ((0, "reproduced"), (1, "not")), said
