"""Load tests of the softknn service, driven only through the generated client (clients/python).

    python -m loadtest.run --host http://127.0.0.1:8000 --users 8 --duration 30 [--out DIR]

mix.py        what a user sends: the weighted request mix (generation too, when the service serves a
              generator), expected statuses and refusals, response checks
streams.py    streamed generation: the generated client's request, read as server-sent events with
              each token's arrival time (time to first token, tokens/s)
report.py     per-call records -> requests/s, p50/p95/p99, failures by type, TTFT and tokens/s per user
              (JSON + CSV); the combined report of --levels
locustfile.py the locust User that times each client call and fires locust's request events
run.py        headless locust wrapper: waits for /readyz, decides generation, bounded users and duration,
              --levels 1,4,16, exit code
"""
