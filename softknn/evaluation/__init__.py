"""softknn's evaluation app: quality of a bundle on a query set beside the plain k-NN baseline, and
the calibration of its abstain rule and retrieval defaults. It uses the core (softknn/) and the
builder (softknn/index_builder/), which never imports it back; the core never imports it
(tests/test_layering.py).

    metrics.py      the metrics as pure functions (recall@k, nDCG@k, MRR@k, accuracy, macro-F1,
                    the abstain trade-off, AUROC; the abstain rules and their thresholds are
                    softknn.retrieval.calibration's, re-exported)
    run.py          query sets, one shared plain pass for softknn and the baseline, the report
    holdout.py      the held-out calibration: a validation split of the KB, its bundle (built
                    with index_builder), the thresholds written into the bundle
    report.py       the report's files: report.json, summary.json, predictions.jsonl, plots
    plots.py        the plots (matplotlib, Agg)
    cli.py          `softknn eval` and `softknn calibrate` (also `python -m softknn.evaluation.cli`)

Importing this package imports nothing else; each module loads what it needs.
"""
