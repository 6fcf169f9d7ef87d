"""Convert ObliQA dev (../shared/data/obliqa_dev) into a softknn KB and a query set with gold ids.

    python -m bench obliqa_prepare [--data ../shared/data/obliqa_dev] [--out artifacts/eval/obliqa]

Writes (never into the repository's tracked files; artifacts/ is git-ignored):
  kb.jsonl         one passage per line, {ID, Passage, DocumentID, PassageID}; the 720 passages
                   whose text is empty are left out (the builder refuses empty records)
  questions.jsonl  {id, text, gold_ids, group}: gold_ids are the KB `ID`s of the question's gold
                   passages. Questions.json names a gold passage by (DocumentID, PassageID), which
                   is not unique for 17 pairs; those are resolved by matching the passage text.
  questions_val.jsonl / questions_test.jsonl
                   a seeded split of the questions (--val of them for choosing defaults, the rest
                   reported as the test set), so no default is tuned on the questions it is scored on
  prepare.json     counts (passages kept / dropped, gold ids unresolved or pointing at empty text)

Build and evaluate with (docs/quality.md):
  softknn build artifacts/eval/obliqa/kb.jsonl --out artifacts/eval/bundles/obliqa --id-field ID \
      --text-field Passage --memory kv --kv-dtype float16
  softknn eval artifacts/eval/bundles/obliqa artifacts/eval/obliqa/questions.jsonl --out ...
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_passages(data: Path) -> list[dict]:
    passages = []
    for f in sorted((data / "documents").glob("*.json"), key=lambda p: int(p.stem)):
        passages += json.loads(f.read_text(encoding="utf-8"))
    return passages


def gold_ids(question: dict, by_key: dict[tuple, list[dict]]) -> tuple[list[str], int, int]:
    """KB ids of a question's gold passages; also (#unresolved, #empty-text) gold entries."""
    ids, unresolved, empty = [], 0, 0
    for g in question["Passages"]:
        cands = by_key.get((g["DocumentID"], g["PassageID"]), [])
        if len(cands) > 1:
            cands = [c for c in cands if c["Passage"] == g["Passage"]] or cands[:1]
        if not cands:
            unresolved += 1
            continue
        p = cands[0]
        if not p["Passage"].strip():
            empty += 1
            continue
        if p["ID"] not in ids:
            ids.append(p["ID"])
    return ids, unresolved, empty


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "obliqa_dev")
    ap.add_argument("--out", type=Path, default=ROOT / "artifacts" / "eval" / "obliqa")
    ap.add_argument("--val", type=int, default=500, help="questions held out for choosing defaults")
    ap.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)

    passages = load_passages(args.data)
    by_key: dict[tuple, list[dict]] = {}
    for p in passages:
        by_key.setdefault((p["DocumentID"], p["PassageID"]), []).append(p)
    kept = [p for p in passages if isinstance(p["Passage"], str) and p["Passage"].strip()]
    with open(args.out / "kb.jsonl", "w", encoding="utf-8") as f:
        for p in kept:
            f.write(json.dumps({k: p[k] for k in ("ID", "Passage", "DocumentID", "PassageID")}, ensure_ascii=False) + "\n")

    questions = json.loads((args.data / "questions.json").read_text(encoding="utf-8"))
    stats = {"passages": len(passages), "passages_kept": len(kept), "passages_empty": len(passages) - len(kept),
             "questions": len(questions), "gold_unresolved": 0, "gold_empty_text": 0, "questions_without_gold": 0}
    with open(args.out / "questions.jsonl", "w", encoding="utf-8") as f:
        for q in questions:
            ids, unresolved, empty = gold_ids(q, by_key)
            stats["gold_unresolved"] += unresolved
            stats["gold_empty_text"] += empty
            stats["questions_without_gold"] += not ids
            f.write(json.dumps({"id": q["QuestionID"], "text": q["Question"], "gold_ids": ids, "group": q["Group"]},
                               ensure_ascii=False) + "\n")
    lines = (args.out / "questions.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    val = set(random.Random(args.seed).sample(range(len(lines)), args.val))
    (args.out / "questions_val.jsonl").write_text("".join(ln for i, ln in enumerate(lines) if i in val), encoding="utf-8")
    (args.out / "questions_test.jsonl").write_text("".join(ln for i, ln in enumerate(lines) if i not in val), encoding="utf-8")
    stats.update(val=len(val), test=len(lines) - len(val), seed=args.seed)
    (args.out / "prepare.json").write_text(json.dumps(stats, indent=2))
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":  # python -m bench obliqa_prepare: the same as python -m bench obliqa_prepare
    import sys

    from bench.__main__ import main

    main(["obliqa_prepare", *sys.argv[1:]])
