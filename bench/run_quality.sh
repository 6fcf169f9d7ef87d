#!/usr/bin/env bash
# Reproduce docs/quality.md: builds, validation sweeps, then the test-set evaluations.
# Reads ../shared/data; writes under artifacts/ (git-ignored). About 2.5 hours on 2 busy CPU cores.
# `softknn eval` is `python -m softknn.evaluation.cli eval` (the same function, registered in softknn/cli.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
DATA=../shared/data
EVAL="python -m softknn.evaluation.cli"
B=artifacts/eval/bundles

# 0. data: the ObliQA KB without its 720 empty passages, questions with gold passage ids, a val/test split
python -m bench obliqa_prepare

# 1. bundles (the defaults: last layer, flat index; ObliQA keys/values in float16)
[ -f $B/banking77/manifest.json ] || softknn build $DATA/banking77/train.csv --out $B/banking77 --label-field category
[ -f $B/obliqa/manifest.json ] || softknn build artifacts/eval/obliqa/kb.jsonl --out $B/obliqa \
    --id-field ID --text-field Passage --memory kv --kv-dtype float16

# 2. sweeps on validation data only (Banking77: the KB side; ObliQA: the 500 validation questions)
python -m bench sweep_banking77 --layers 5 3 1
python -m bench sweep_obliqa --limit 200       # 200 of the 500 validation questions (time budget)

# 3. Banking77: calibrate the abstain threshold on a 10% KB split (reusing the sweep's split bundle),
#    then evaluate on test.csv, with the ObliQA test questions as out-of-domain inputs
$EVAL eval $B/banking77 $DATA/banking77/test.csv --label-field category \
    --ood artifacts/eval/obliqa/questions_test.jsonl \
    --calibrate-kb $DATA/banking77/train.csv --kb-label-field category \
    --calibration-work artifacts/eval/banking77/validation/L5 \
    --out artifacts/eval/banking77/test

# 4. ObliQA: evidence quality on the 2,288 test questions (k = 10, so ten evidence items)
$EVAL eval $B/obliqa artifacts/eval/obliqa/questions_test.jsonl --k 10 --out artifacts/eval/obliqa/test
