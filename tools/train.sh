#!/bin/bash
# The embedded pair from nothing, every step of it (docs/results.md, "The embedded models"):
# the data, the two training stages, the Spiffy graphs, the cost tables, the report, the
# greedy fixture.
#
#   bash tools/train.sh   # about 8 h 20 min on 2 CPU cores; run it again to go on after a stop
#
# Each step is train.py (or tools/distill.py) with the flags below. A finished step leaves
# out/<step>.done and is skipped the next time; an interrupted one goes on from its last
# checkpoint (out/<step>/ckpt.pt, with --resume). The models are written to models/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out

run() {  # name, the script, its flags: skipped when done, resumed from out/<name>/ckpt.pt
    local name=$1 script=$2
    shift 2
    if [ -f "out/$name.done" ]; then
        echo "$name: done before"
        return
    fi
    local resume=()
    [ -f "out/$name/ckpt.pt" ] && resume=(--resume)
    python "$script" "$@" "${resume[@]}"
    touch "out/$name.done"
}
step() { run "$1" train.py "${@:2}" --ckpt-dir "out/$1"; }   # name, then train.py's flags

[ -f data/meta.json ] || python tools/prepare.py
for preset in drafter target; do
    step "$preset-1" --preset "$preset"                              # stage one: every token noised
    step "$preset-2" --preset "$preset" --finetune                   # stage two: answers only
done
# Copying the question's people and things (docs/results.md): the answer tokens that name what
# the question names weigh more, at stage two's low end of the rate, then less and less.
step target-3 --preset target --finetune --copy-weight 30 --iters 800 --lr 1.5e-4 --warmup 0 --eval-every 200
step target-4 --preset target --finetune --copy-weight 10 --iters 400 --lr 1e-4 --warmup 0 --eval-every 200
step target-5 --preset target --finetune --copy-weight 3 --iters 400 --lr 1e-4 --warmup 0 --eval-every 200
# B = 32 accuracy back (docs/results.md, "B = 32 after the copy phases"): the same light phase,
# two of three batches at B = 32.
step target-6 --preset target --finetune --copy-weight 3 --block-weights 1,1,4 --iters 400 --lr 1e-4 --warmup 0 --eval-every 200
step drafter-3 --preset drafter --finetune --copy-weight 10 --iters 400 --lr 2e-3 --warmup 20 --eval-every 200
step drafter-4 --preset drafter --finetune --copy-weight 10 --iters 800 --lr 5e-4 --warmup 0 --eval-every 200
# Distillation (train.py --distill): the drafter learns the target's distribution on the same
# noised answers (KL(target || drafter) alone, --distill-weight 1), the choices SimSD accepts;
# about half an hour on one thread (1.2-1.5 s an iteration, the frozen target's forward included).
step drafter-5 --preset drafter --finetune --distill models/target --iters 1200 --lr 5e-4 --warmup 0 --eval-every 200
# On the target's own answers (tools/distill.py): its threshold-rule answers to 4000 training questions,
# then (1 - W) * cross-entropy to them + W * KL(target || drafter), W = 0.5, on the states the
# target decodes through (--teacher-order: a block's masked positions the ones it is least sure
# of), 1500 iterations; about 15 min (2 min 30 s of answers). Then 3000 more iterations from it
# at a lower rate; about 26 min; then 4000 more at a lower rate still; about 36 min; then 4000
# more on the answers to 12000 questions (5 min of answers, 32 min), twice 4000 more on those
# (31 and 35 min), and 4000 more on the answers to 24000 (10 min of answers, 31 min): each
# step's counts in docs/results.md, "The drafter distilled on the target's own answers". The last one replaces models/drafter. Each step starts from the weights and the answers
# of the step before: the target's answers to the same questions are the same, so a step
# decodes only the questions the one before had not.
distil() {  # name, the step it goes on from (or -), then tools/distill.py's flags
    local from=()
    if [ "$2" != - ]; then
        from=(--drafter "out/$2")
        [ -f "out/$1.done" ] || [ -f "out/$1/answers.jsonl" ] \
            || { mkdir -p "out/$1" && cp "out/$2/answers.jsonl" "out/$1/"; }
    fi
    run "$1" tools/distill.py --prompts out/train_questions.jsonl --out "out/$1" --max-new-tokens 64 \
        --distill-weight 0.5 --teacher-order --threads 1 "${from[@]}" "${@:3}"
}
questions() { [ -f "$1" ] || python tools/prepare.py --questions "$1" --n_questions "$2"; }   # file, count
questions out/train_questions.jsonl 4000
distil drafter-6 - --iters 1500
distil drafter-7 drafter-6 --iters 3000 --lr 1.5e-4 --warmup 0
distil drafter-8 drafter-7 --iters 4000 --lr 1e-4 --warmup 0
questions out/train_questions_12k.jsonl 12000
distil drafter-9 drafter-8 --iters 4000 --lr 1e-4 --warmup 0 --prompts out/train_questions_12k.jsonl
distil drafter-10 drafter-9 --iters 4000 --lr 1e-4 --warmup 0 --prompts out/train_questions_12k.jsonl
distil drafter-11 drafter-10 --iters 4000 --lr 1e-4 --warmup 0 --prompts out/train_questions_12k.jsonl
questions out/train_questions_24k.jsonl 24000
distil drafter-12 drafter-11 --iters 4000 --lr 1e-4 --warmup 0 --prompts out/train_questions_24k.jsonl
for f in config.json model.safetensors tokenizer.model distill_log.json; do cp "out/drafter-12/$f" models/drafter/; done
python tools/calibrate.py                                            # the graphs, next to the target
python tools/costs.py              # the cost tables (a quiet machine: they are timings), next to it too
python train.py --report
python tests/fixtures/record_greedy.py      # the greedy output tests/test_cli.py checks the pair against
