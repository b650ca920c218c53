#!/bin/bash
# The embedded pair from nothing, every step of it (docs/results.md, "The embedded models"):
# the data, the two training stages, the Spiffy graphs, the report.
#
#   bash train.sh            # about 2 hours on 2 CPU cores; run it again to go on after a stop
#
# Each step is train.py (or spiffy.py) with the flags below. A finished step leaves
# out/<step>.done and is skipped the next time; an interrupted one goes on from its last
# checkpoint (out/<step>/ckpt.pt, with --resume). The models are written to models/.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p out

step() {  # name, then train.py's flags
    local name=$1
    shift
    if [ -f "out/$name.done" ]; then
        echo "$name: done before"
        return
    fi
    local resume=()
    [ -f "out/$name/ckpt.pt" ] && resume=(--resume)
    python train.py "$@" --ckpt-dir "out/$name" "${resume[@]}"
    touch "out/$name.done"
}

[ -f data/meta.json ] || python prepare.py
for preset in drafter target; do
    step "$preset-1" --preset "$preset"                              # stage one: every token noised
    step "$preset-2" --preset "$preset" --finetune                   # stage two: answers only
done
# (The copy phases tried after these, docs/results.md "Copying the question's people and
# things", are steps like: step target-3 --preset target --finetune --copy-weight 10 ...)
python spiffy.py --calibrate                                         # the graphs, next to the target
python train.py --report
