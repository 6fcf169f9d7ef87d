"""The evidence explorer (GET /, softknn/service/static/) in a real browser.

Debian's headless Chromium (`apt-get install chromium chromium-driver`), driven by Playwright's
Python package through `executable_path` (never `playwright install`), against a real uvicorn
server on a free port serving the sample bundle. Every number the page shows is checked against
the same request sent with httpx. Screenshots (1024 px and 390 px) go to artifacts/explorer/, and
the 1024 px default view is copied to docs/explorer.png for the README when that file is
missing or SOFTKNN_UPDATE_DOCS_SCREENSHOT=1. SOFTKNN_CHROMIUM overrides /usr/bin/chromium.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from softknn.index_builder.pipeline import BuildConfig, build_bundle
from softknn.params import Settings
from softknn.service.app import create_app
from tests.harness import threaded_server
from tests.numerics import close

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "explorer"
DOCS_SHOT = REPO / "docs" / "explorer.png"
CHROMIUM = Path(os.environ.get("SOFTKNN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
QUERY = "How much is a child ticket on the Blue Line?"
TOL = 1e-6  # the page's data-value against a second run of the same request


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(encoder, sample_bundle_path) -> Iterator[str]:
    """A real uvicorn server (in a thread, sharing the session's model) on a free port; its base URL."""
    app = create_app(Settings(bundle=sample_bundle_path), encoder=encoder)
    with threaded_server(app, log_config=None, access_log=False, lifespan="on") as client:
        yield str(client.base_url).rstrip("/")


@pytest.fixture(scope="module")
def api(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        msg = f"{CHROMIUM} not found: apt-get install -y chromium chromium-driver"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser: Browser, server: str, width: int = 1024, height: int = 900) -> Page:
    page = browser.new_page(viewport={"width": width, "height": height})
    page.errors = []  # uncaught page exceptions; every test asserts there were none
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(server + "/")
    page.wait_for_selector("body[data-ready]")  # defaults and bounds read from /openapi.json
    page.fill("#text", QUERY)
    return page


@pytest.fixture
def page(browser, server) -> Iterator[Page]:
    p = open_page(browser, server)
    yield p
    assert p.errors == []
    p.close()


def classic(page: Page) -> None:
    """One pane (the page opens side by side with the plain model), in the API's default mixing."""
    assert page.input_value("#mixing") == "fixed"
    page.uncheck("#compare")


def run(page: Page) -> dict:
    """Click Run, wait until the page has finished this run; the JSON body the page sent (the first
    one, when it sends two)."""
    before = int(page.evaluate("document.body.dataset.done || '0'"))
    with page.expect_request("**/v1/infer") as req:
        page.click("#run")
    page.wait_for_function("n => Number(document.body.dataset.done || 0) > n", arg=before)
    return req.value.post_data_json


def infer(api: httpx.Client, body: dict) -> dict:
    r = api.post("/v1/infer", json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


def shown(text: str, value: float) -> bool:
    """The page's fmt(): 3 decimals, exponent form for values that would print as 0.000."""
    if "e" in text:
        return math.isclose(float(text), value, rel_tol=0.05)
    return abs(float(text) - value) <= 0.0005 + 1e-9


def values(page: Page, selector: str, attr: str = "data-value") -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute('{attr}'))")]


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def check_evidence(page: Page, scope: str, result: dict) -> None:
    """Evidence items, their numbers and their highlighted spans are the API's, in the API's order."""
    items = page.locator(f"{scope} li.item")
    assert items.count() == len(result["evidence"]) > 0
    for i, ev in enumerate(result["evidence"]):
        item = items.nth(i)
        assert item.get_attribute("data-chunk-id") == ev["chunk_id"]
        assert item.locator(".tag").inner_text() == (ev["label"] or "no label")
        for field in ("weight", "mass_share", "similarity", "influence"):
            el = item.locator(f".num[data-field='{field}']")
            assert abs(float(el.get_attribute("data-value")) - ev[field]) <= TOL, (ev["chunk_id"], field)
            assert shown(el.inner_text(), ev[field]), (ev["chunk_id"], field, el.inner_text())
        drawn = sorted((s for s in ev["spans"] if s["weight"] > 0), key=lambda s: s["start"])
        marks = item.locator("mark.hl")
        assert marks.count() == len(drawn)
        for j, s in enumerate(drawn):
            m = marks.nth(j)
            assert m.inner_text() == s["text"]  # position = span.start − item.start inside item.text
            assert int(m.get_attribute("data-start")) == s["start"]
            assert abs(float(m.get_attribute("data-weight")) - s["weight"]) <= TOL
            title = m.get_attribute("title")
            assert f"weight {float(m.get_attribute('data-weight')):.3f}" in title or "e-" in title
            for q in s["query_tokens"]:
                assert (q["text"] if q["text"] != "[special]" else "[") in title


# --- tests -------------------------------------------------------------------------------------
def test_query_shows_the_evidence_tokens_and_labels_the_api_returned(page, api):
    classic(page)
    body = run(page)
    # τ, retrieval and λ left at "auto" (the schema's null defaults): the service picks them per bundle
    assert body == {"inputs": [QUERY], "alpha": 0.7, "mixing": "fixed", "k": 8, "return_tokens": True}
    r = infer(api, body)
    check_evidence(page, ".pane[data-variant='current']", r)

    assert len(page.locator(".tok").all()) == len(r["tokens"])
    assert values(page, ".tok") == pytest.approx([t["memory_share"] for t in r["tokens"]], abs=TOL)
    nh, n = len(r["head_memory_share"]), len(r["tokens"])
    assert values(page, ".heat .cell") == pytest.approx([v for row in r["head_memory_share"] for v in row], abs=TOL)
    assert len(values(page, ".heat .cell")) == nh * n == 12 * n
    assert "joint mixing shows where the KB was used" in page.locator("[data-field='flat_note']").inner_text()
    d = r["diagnostics"]
    for field in ("memory_share", "w_db_entropy", "w_db_effective_k", "attention_effective_k"):
        assert close(float(page.get_attribute(f".diag dd[data-field='{field}']", "data-value")), d[field], TOL), field
    assert page.locator(".diag dd[data-field='w_db_effective_k']").inner_text() == f"{d['w_db_effective_k']:.3f}"
    assert r["label_scores"] is not None  # the sample KB is labelled
    assert page.get_attribute(".decision", "data-prediction") == (r["prediction"] or "")
    assert page.eval_on_selector_all(".scores li", "els => els.map(e => e.dataset.label)") == list(r["label_scores"])
    assert values(page, ".scores li") == pytest.approx(list(r["label_scores"].values()), abs=TOL)

    # provenance comes from GET /v1/entries/{chunk_id}
    first = r["evidence"][0]
    page.locator("li.item").first.locator(".prov summary").click()
    page.wait_for_selector("li.item >> nth=0 >> .prov .kv")
    prov = page.locator("li.item").first.locator(".prov .kv").inner_text()
    entry = api.get(f"/v1/entries/{first['chunk_id']}").json()["entry"]
    assert f"{entry['doc_id']}, chars {entry['start']}–{entry['end']}" in prov
    assert str(len(entry["token_spans"])) in prov
    screenshot(page, "explorer-1024-fixed.png")


def test_default_view_shows_what_the_kb_changed_against_the_plain_model(page, api):
    """The page as it opens: the API's default mixing (fixed, as the CLI and a request naming none
    get), side by side with the plain model (α = 1), and the KB's effect on the model's own output:
    e against e', their nearest KB entries, the heat map."""
    with page.expect_request(lambda q: "/v1/infer" in q.url and q.post_data_json["alpha"] == 1) as base_req:
        body = run(page)
    assert body == {"inputs": [QUERY], "alpha": 0.7, "mixing": "fixed", "k": 8, "return_tokens": True}
    # the same memory share as the request with no parameters at all (the CLI's and the API's default)
    plain_default = api.post("/v1/infer", json={"inputs": [QUERY]}).json()["results"][0]["diagnostics"]
    shown = float(page.get_attribute(".pane[data-variant='current'] .diag dd[data-field='memory_share']", "data-value"))
    assert shown == pytest.approx(plain_default["memory_share"], abs=TOL) == pytest.approx(0.3, abs=1e-6)
    assert base_req.value.post_data_json["mixing"] == "fixed"
    r, base = infer(api, body), infer(api, base_req.value.post_data_json)
    cur = ".pane[data-variant='current']"
    check_evidence(page, cur, r)
    check_evidence(page, ".pane[data-variant='baseline']", base)
    v = r["versus_plain"]
    # e is the plain model's own output: the α = 1 answer's embedding, to float round-off
    cos = sum(a * b for a, b in zip(base["embedding"], r["embedding"], strict=True))
    assert v["cosine"] == pytest.approx(cos, abs=1e-5)
    assert v["l2"] == pytest.approx(math.sqrt(max(0.0, 2 - 2 * cos)), abs=1e-4)
    for field, want in (("vp_cosine", v["cosine"]), ("vp_l2", v["l2"])):
        assert float(page.get_attribute(f".kb-change .num[data-field='{field}']", "data-value")) == pytest.approx(want, abs=TOL)
    assert page.locator(".kb-change").is_visible()
    # a visible difference: the embedding moved, and its nearest KB entries with it
    assert v["l2"] > 0.05
    near = {f: page.eval_on_selector_all(f".near[data-field='{f}'] li", "els => els.map(e => e.dataset.chunkId)")
            for f in ("nearest_plain", "nearest_augmented")}
    assert near == {f: [x["chunk_id"] for x in v[f]] for f in near}
    dense = {e["chunk_id"]: e["dense_similarity"] for e in base["evidence"]}  # e·e_c of the α = 1 answer
    both = [x for x in v["nearest_plain"] if x["chunk_id"] in dense]
    assert both and all(x["similarity"] == pytest.approx(dense[x["chunk_id"]], abs=1e-5) for x in both)
    assert near["nearest_plain"] != near["nearest_augmented"]
    moved = page.eval_on_selector_all(".near li.moved", "els => els.map(e => e.dataset.chunkId)")
    assert set(moved) == set(near["nearest_plain"]) ^ set(near["nearest_augmented"]) != set()
    assert page.locator(".near li.moved").first.is_visible()
    # the heat map: the α rule gives every head and token exactly 1 − α, and the page says where to
    # see more (joint mixing spreads it: test_joint_mixing_heat_map_spans_the_head_range)
    flat = [x for row in r["head_memory_share"] for x in row]
    assert (min(flat), max(flat)) == pytest.approx((0.3, 0.3), abs=1e-5)
    assert "joint mixing shows where the KB was used" in page.locator(f"{cur} [data-field='flat_note']").inner_text()
    # and the page says where the label scores come from
    assert "k-NN weights" in page.locator(".kb-change [data-field='labels_note']").inner_text()
    assert page.locator(f"{cur} .scores li").count() == len(r["label_scores"])
    shot = screenshot(page, "explorer-1024-default.png")
    # The README's picture is this view: written when missing or when asked, so a test run does not
    # dirty the work tree with a new PNG (request id and timing differ every run).
    if not DOCS_SHOT.exists() or os.environ.get("SOFTKNN_UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, DOCS_SHOT)


@pytest.mark.parametrize("mode", ["lexical", "dense", "hybrid"])
def test_retrieval_control_sends_it_and_evidence_shows_why_each_chunk_came(page, api, mode):
    classic(page)
    page.select_option("#retrieval", mode)
    page.fill("#lexical_weight", "0.3")
    body = run(page)
    assert (body["retrieval"], body["lexical_weight"]) == (mode, 0.3)
    r = infer(api, body)
    check_evidence(page, ".pane[data-variant='current']", r)
    assert page.get_attribute(".pane[data-variant='current']", "data-retrieval") == mode
    assert page.locator(".diag dd[data-field='retrieval']").inner_text() == mode
    items = page.locator("li.item")
    for i, ev in enumerate(r["evidence"]):
        item = items.nth(i)
        dense = float(item.locator(".num[data-field='dense_similarity']").get_attribute("data-value"))
        assert dense == pytest.approx(ev["dense_similarity"], abs=TOL)
        if mode == "dense":
            assert ev["bm25"] is None and item.locator(".num[data-field='bm25']").count() == 0
            continue
        assert close(float(item.locator(".num[data-field='bm25']").get_attribute("data-value")), ev["bm25"], TOL)
        words = item.locator("[data-field='matched_terms']").inner_text()
        assert words == (", ".join(ev["matched_terms"]) or "none")


def test_changing_alpha_changes_the_evidence_and_compare_shows_alpha_1(page, api):
    classic(page)
    run(page)
    before = values(page, ".num[data-field='mass_share']")
    page.fill("#alpha", "0.2")
    body = run(page)
    assert body["alpha"] == 0.2
    r = infer(api, body)
    check_evidence(page, ".pane[data-variant='current']", r)
    after = values(page, ".num[data-field='mass_share']")
    assert after != pytest.approx(before, abs=1e-3)
    # fixed mixing: mass_share = (1 − α)·w_db, and the memory share is 1 − α
    assert after == pytest.approx([0.8 * e["weight"] for e in r["evidence"]], abs=1e-5)
    assert float(page.get_attribute(".diag dd[data-field='memory_share']", "data-value")) == pytest.approx(0.8, abs=1e-5)

    page.check("#compare")
    with page.expect_request(lambda q: "/v1/infer" in q.url and q.post_data_json["alpha"] == 1) as base_req:
        run(page)
    assert page.locator(".pane").count() == 2
    base = infer(api, base_req.value.post_data_json)
    assert base_req.value.post_data_json["mixing"] == "fixed"
    check_evidence(page, ".pane[data-variant='baseline']", base)
    check_evidence(page, ".pane[data-variant='current']", r)
    assert page.get_attribute(".pane[data-variant='baseline'] .diag dd[data-field='memory_share']", "data-value") == "0"
    assert page.locator(".pane[data-variant='baseline'] mark.hl").count() == 0  # α = 1 draws nothing
    cos = sum(a * b for a, b in zip(base["embedding"], r["embedding"], strict=True))
    cos /= math.sqrt(sum(a * a for a in base["embedding"]) * sum(b * b for b in r["embedding"]))
    assert float(page.get_attribute(".num[data-field='cosine']", "data-value")) == pytest.approx(cos, abs=1e-5)
    assert cos < 0.9999  # the KB moved the output
    screenshot(page, "explorer-1024-compare.png")


def test_joint_mixing_heat_map_spans_the_head_range(page, api):
    page.uncheck("#compare")
    page.select_option("#mixing", "joint")
    body = run(page)
    assert body["mixing"] == "joint"
    r = infer(api, body)
    check_evidence(page, ".pane", r)
    flat = [v for row in r["head_memory_share"] for v in row]
    assert float(page.get_attribute(".num[data-field='heat_min']", "data-value")) == pytest.approx(min(flat), abs=TOL)
    assert float(page.get_attribute(".num[data-field='heat_max']", "data-value")) == pytest.approx(max(flat), abs=TOL)
    assert max(flat) - min(flat) > 0.1  # not one flat block: joint mixing spreads the share over heads and tokens
    assert page.get_attribute(".diag dd[data-field='alpha']", "data-value") == "null"
    screenshot(page, "explorer-1024-joint.png")


@pytest.mark.parametrize(("control", "bad", "field"), [("#k", "0", "k"), ("#temperature", "-1", "knn_temperature")])
def test_an_invalid_value_shows_the_services_422_message(page, api, control, bad, field):
    page.uncheck("#compare")
    page.fill(control, bad)
    body = run(page)
    r = api.post("/v1/infer", json=body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == field
    box = page.locator("#error")
    assert box.is_visible()
    assert box.get_attribute("data-status") == "422"
    assert err["message"] in box.inner_text()
    assert page.get_attribute(control, "aria-invalid") == "true"
    assert page.locator("li.item").count() == 0

    page.fill(control, "8" if field == "k" else "0.05")
    run(page)
    assert box.is_hidden()
    assert page.get_attribute(control, "aria-invalid") is None
    assert page.locator("li.item").count() > 0


def test_429_and_401_are_shown_as_messages(page):
    def answer(status, kind, message, headers):
        return lambda route: route.fulfill(status=status, headers={"Content-Type": "application/json", **headers},
                                           body=f'{{"error": {{"type": "{kind}", "message": "{message}", "field": null}}}}')

    page.route("**/v1/infer", answer(429, "queue_full", "the inference queue is full", {"Retry-After": "7"}))
    run(page)
    text = page.locator("#error").inner_text()
    assert "429" in text and "the inference queue is full" in text and "Retry after 7 s" in text
    page.unroute("**/v1/infer")

    page.route("**/v1/infer", answer(401, "unauthorized", "invalid API key", {"WWW-Authenticate": "Bearer"}))
    run(page)
    text = page.locator("#error").inner_text()
    assert "401" in text and "invalid API key" in text and "Set the API key" in text


def test_api_key_is_kept_in_local_storage_and_sent_as_bearer(page, server):
    page.click("#auth summary")
    page.fill("#api-key", "key-from-the-test")
    page.press("#api-key", "Enter")
    assert page.evaluate("localStorage.getItem('softknn.apiKey')") == "key-from-the-test"
    page.reload()
    page.wait_for_selector("body[data-ready]")
    assert page.input_value("#api-key") == "key-from-the-test"
    page.fill("#text", QUERY)
    with page.expect_request("**/v1/infer") as req:
        page.click("#run")
    assert req.value.headers["authorization"] == "Bearer key-from-the-test"
    page.wait_for_selector("li.item")
    page.click("#auth summary")  # closed again after the reload
    page.click("#key-clear")
    assert page.evaluate("localStorage.getItem('softknn.apiKey')") is None


def test_phone_width_has_no_horizontal_scroll(browser, server, api):
    page = open_page(browser, server, width=390, height=844)
    run(page)  # the default view: two panes stacked, the KB-change panel above them
    assert page.locator(".kb-change").is_visible() and page.locator(".pane").count() == 2
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    classic(page)
    body = run(page)
    check_evidence(page, ".pane", infer(api, body))
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.locator("#run").bounding_box()["width"] > 300  # full-width button on a phone
    screenshot(page, "explorer-390.png")
    assert page.errors == []
    page.close()


def test_api_docs_render_with_no_network(browser, server):
    """/docs is Swagger UI from the packaged copy (fastapi-offline), not a CDN: with every request
    that leaves the server refused, the page still lists the operations."""
    page = browser.new_page(viewport={"width": 1024, "height": 900})
    outside: list[str] = []

    def only_the_server(route):
        if route.request.url.startswith(server):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", only_the_server)
    page.goto(server + "/docs")
    page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=30_000)
    paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.dataset.path || e.textContent)")
    assert {"/v1/infer", "/v1/index", "/healthz"} <= {p.replace("\u200b", "") for p in paths}
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("softknn")
    assert outside == []
    screenshot(page, "docs-offline.png")
    page.close()


# --- several KBs: the picker ---------------------------------------------------------------------
RIVER_KB = [("river-1", "The river bus to Greenwich leaves every twenty minutes from the pier.", "routes"),
            ("river-2", "Children under five ride the river bus free with a paying adult.", "fares"),
            ("river-3", "Bicycles are carried on the river bus outside the rush hours.", "rules")]


@pytest.fixture(scope="module")
def two_kb_server(encoder, sample_bundle_path, tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("river")
    (root / "kb.jsonl").write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n"
                                           for i, t, lab in RIVER_KB))
    build_bundle(root / "kb.jsonl", root / "bundle", BuildConfig(), encoder, progress=False)
    app = create_app(Settings(bundles={"ferries": sample_bundle_path, "river": root / "bundle"}), encoder=encoder)
    with threaded_server(app, log_config=None, access_log=False, lifespan="on") as client:
        yield str(client.base_url).rstrip("/")


def test_several_kbs_the_picker_names_the_chosen_kb_in_every_request(browser, server, two_kb_server):
    # one KB: no picker, and requests name none (the service's default applies)
    single = open_page(browser, server)
    assert single.locator("#kb-field").is_hidden()
    assert "kb" not in run(single)
    single.close()

    page = open_page(browser, two_kb_server)
    with httpx.Client(base_url=two_kb_server, timeout=30) as api:
        listing = api.get("/v1/kbs").json()
        versions = {k["name"]: k["bundle_version"] for k in listing["kbs"]}
        assert listing["default"] is None and list(versions) == ["ferries", "river"]
        assert page.locator("#kb-field").is_visible()
        assert [page.locator("#kb option").nth(i).inner_text() for i in range(2)] == [
            f"{k['name']} · {k['chunks']} chunks" for k in listing["kbs"]]
        assert page.input_value("#kb") == "ferries"  # no default for this service: the first KB
        assert versions["ferries"] in page.locator("#bundle").inner_text()
        classic(page)
        body = run(page)
        assert body["kb"] == "ferries"
        page.wait_for_selector("li.item")
        check_evidence(page, ".pane", infer(api, body))

        page.select_option("#kb", "river")
        page.wait_for_function("v => document.getElementById('bundle').textContent.includes(v)", arg=versions["river"])
        body = run(page)
        assert body["kb"] == "river"
        page.wait_for_selector("li.item")
        full = api.post("/v1/infer", json=body).json()
        assert full["bundle_version"] == versions["river"]
        answer = full["results"][0]
        assert answer["evidence"][0]["chunk_id"].startswith("river-")
        check_evidence(page, ".pane", answer)
        # an entry opened from the evidence is read from the chosen KB too
        with page.expect_request("**/v1/entries/**") as req:
            page.locator("li.item").first.locator("details.prov summary").click()
        assert req.value.url.endswith("kb=river")
    assert page.errors == []
    page.close()
