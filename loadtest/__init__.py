"""Load tests of the softknn service, driven only through the generated client (clients/python).

    python -m loadtest.run --host http://127.0.0.1:8000 --users 8 --duration 30 [--out DIR]

mix.py        what a user sends: the weighted request mix, expected statuses, response checks
report.py     per-call records -> requests/s, p50/p95/p99, failures by type (JSON + CSV)
locustfile.py the locust User that times each client call and fires locust's request events
run.py        headless locust wrapper: waits for /readyz, bounded users and duration, exit code
"""
