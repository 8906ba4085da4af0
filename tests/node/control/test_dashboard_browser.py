"""The dashboard in a real browser (headless chromium, selenium), as an operator uses it: signed in through
its form, in front of a router and four simulated engines with three tenants' traffic. One browser and
one fleet for the module; the tests run in order (the fleet changes: a worker drained, one killed). The
last one looks at a fleet of 64 simulated engines (in-process, started in well under a second)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from selenium.webdriver.common.by import By

from prefix_router.lab.launch.showcase import QUIET, Showcase, showcase
from prefix_router.node.control.dashboard.session import COOKIE
from support.browser import chrome, console_errors, read, sign_in, wait_for

WORKERS = 4
BIG_FLEET = 64
RENDER_BOUND_MS = 2000  # generous: a loaded 2-core machine; a render takes tens of ms on a quiet one
# in the page: fetch the document, draw it with the page's own ``draw`` and lay it out, timed there
TIMED_RENDER = """const done = arguments[arguments.length - 1];
(async () => {
  const t0 = performance.now();
  const response = await fetch("/dashboard/data", { credentials: "same-origin", cache: "no-store" });
  const doc = await response.json();
  const t1 = performance.now();
  draw(doc);
  void document.body.offsetHeight;  // layout now, inside the timing
  const t2 = performance.now();
  done({ status: response.status, workers: doc.workers.length, fetch_ms: t1 - t0, draw_ms: t2 - t1 });
})().catch(err => done({ error: String(err) }));"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Showcase]:
    with showcase(WORKERS, {"health.fail_threshold": 1}) as running:
        yield running


@pytest.fixture(scope="module")
def browser(fleet: Showcase) -> Iterator[Any]:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


def rows(driver: Any, table: str) -> list[dict[str, Any]]:
    """A table's rows as they are now: each one's data attributes, class and text."""
    script = f"""[...document.querySelectorAll('#{table} tbody tr')].map(r => ({{
        data: {{...r.dataset}}, cls: r.className, text: r.textContent,
        home: (r.querySelector('.main-holder') || {{}}).textContent}}))"""
    return list(read(driver, script))


def worker_class(driver: Any, name: str) -> str:
    return str(next(r["cls"] for r in rows(driver, "workers") if r["data"]["worker"] == name))


def newest_seq(driver: Any) -> int:
    found = rows(driver, "feed")
    return int(found[0]["data"]["seq"]) if found else -1


def points(driver: Any, line: str) -> str:
    return str(read(driver, f"document.querySelector('{line}').getAttribute('points')"))


def test_without_the_admin_token_the_page_and_its_data_answer_401(fleet: Showcase, browser: Any) -> None:
    for path in ("/dashboard", "/dashboard/data", "/dashboard/static/dashboard.js", "/admin/decisions"):
        assert fleet.admin("GET", path, token=None)[0] == 401, path
        assert fleet.admin("GET", path, token="not-the-token")[0] == 401, path
    browser.get(fleet.url + "/dashboard")  # the login form, and no data
    assert browser.find_element(By.ID, "token").get_attribute("type") == "password"
    assert not browser.find_elements(By.ID, "workers")
    sign_in(browser, fleet.url, token="not-the-token")
    wait_for(browser, lambda d: "not the admin token" in d.find_element(By.ID, "note").text)


def test_the_page_shows_every_worker_with_no_console_error(fleet: Showcase, browser: Any) -> None:
    sign_in(browser, fleet.url)
    assert "token" not in browser.current_url and browser.current_url.endswith("/dashboard")
    wait_for(browser, lambda d: len(rows(d, "workers")) == WORKERS)
    names = {r["data"]["worker"] for r in rows(browser, "workers")}
    assert names == {f"sim-{i}" for i in range(WORKERS)}
    assert all("health-healthy" in r["cls"] for r in rows(browser, "workers"))
    time.sleep(1.5)  # a poll more
    assert console_errors(browser) == []


def test_the_feed_and_the_charts_update_while_traffic_runs(fleet: Showcase, browser: Any) -> None:
    before = newest_seq(browser)
    fleet.start_traffic(clients=3)
    wait_for(browser, lambda d: newest_seq(d) > before + 10)
    first = newest_seq(browser)
    wait_for(browser, lambda d: newest_seq(d) > first)  # and again: it is live
    feed = rows(browser, "feed")[0]["text"]
    assert re.search(r"sim-\d", feed) and "t-" in feed and "p-" in feed  # worker, hashed tenant and prefix
    drawn = points(browser, "#chart-ttft polyline.obs")
    wait_for(browser, lambda d: points(d, "#chart-ttft polyline.obs") not in ("", drawn), timeout_s=45)
    assert points(browser, "#chart-hit polyline.obs")  # the engines' reported hit rate is drawn
    assert console_errors(browser) == []


def home_of_a_tenant(driver: Any) -> tuple[str, str]:
    """A prefix of a tenant on the map and its home (the worker its last request went to)."""
    for row in rows(driver, "prefixes"):
        if row["data"]["tenant"] and row["home"].startswith("sim-"):
            return str(row["data"]["prefix"]), str(row["home"])
    raise AssertionError("no tenant's prefix on the map")


def test_the_prefix_map_shows_a_tenant_moving_when_its_worker_is_drained(
    fleet: Showcase, browser: Any
) -> None:
    wait_for(browser, lambda d: any(r["data"]["tenant"] for r in rows(d, "prefixes")))
    prefix, home = home_of_a_tenant(browser)
    status, _ = fleet.admin("POST", f"/admin/workers/{home}/drain")
    assert status == 200
    wait_for(browser, lambda d: "draining" in worker_class(d, home))

    def moved(d: Any) -> bool:
        row = next(r for r in rows(d, "prefixes") if r["data"]["prefix"] == prefix)
        return row["home"] not in (home, "nowhere")

    wait_for(browser, moved, timeout_s=45)
    moves = read(
        browser,
        f"[...document.querySelectorAll('#moves li[data-prefix=\"{prefix}\"]')].map(li => li.textContent)",
    )
    assert any(f"{home} →" in move for move in moves), moves
    fleet.admin("POST", f"/admin/workers/{home}/undrain")


def test_a_killed_worker_turns_red_within_the_health_interval(fleet: Showcase, browser: Any) -> None:
    victim = "sim-3"
    assert "health-healthy" in worker_class(browser, victim)
    killed = time.monotonic()
    fleet.kill(victim)
    wait_for(browser, lambda d: "health-ejected" in worker_class(d, victim), timeout_s=10)
    took = time.monotonic() - killed
    # one failed probe ejects it (fail_threshold 1), probes every interval; the page polls every second
    assert took < QUIET["health.interval_s"] + QUIET["health.timeout_s"] + 1.0 + 1.0, took
    dot = f'#workers tr[data-worker="{victim}"] .dot'
    colour = str(read(browser, f"getComputedStyle(document.querySelector('{dot}')).backgroundColor"))
    red, green, blue = (int(x) for x in re.findall(r"\d+", colour)[:3])
    assert red > 150 and green < 100 and blue < 100, colour
    data = orjson.loads(fleet.admin("GET", "/dashboard/data")[1])
    assert {w["name"]: w["health"] for w in data["workers"]}[victim] == "ejected"


def test_signing_out_revokes_the_session_a_copied_cookie_included(fleet: Showcase, browser: Any) -> None:
    sign_in(browser, fleet.url)  # a fresh session
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#logout button"))
    copied = browser.get_cookie(COOKIE)["value"]  # what someone who copied it would hold
    assert fetch_status(fleet.url + "/dashboard/data", copied) == 200
    browser.find_element(By.CSS_SELECTOR, "#logout button").click()
    wait_for(browser, lambda d: "Signed out" in d.find_element(By.ID, "note").text)
    assert browser.get_cookie(COOKIE) is None  # gone from the browser ...
    assert fetch_status(fleet.url + "/dashboard/data", copied) == 401  # ... and refused when replayed


def fetch_status(url: str, cookie: str) -> int:
    request = urllib.request.Request(url, headers={"Cookie": f"{COOKIE}={cookie}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.fixture(scope="module")
def big_fleet() -> Iterator[Showcase]:
    # ttft: a policy that explains its decisions (each candidate's predicted first-token time and parts)
    with showcase(BIG_FLEET, {"health.interval_s": 2.0, "routing.policy": "ttft"}) as running:
        yield running


def test_64_workers_and_their_candidates_are_drawn_and_the_page_stays_responsive(
    big_fleet: Showcase, browser: Any
) -> None:
    big_fleet.start_traffic(clients=4, pause_s=0.01)
    sign_in(browser, big_fleet.url)
    wait_for(browser, lambda d: len(rows(d, "workers")) == BIG_FLEET)
    wait_for(browser, lambda d: len(rows(d, "feed")) >= 20 and len(rows(d, "prefixes")) >= 3)
    timings = [browser.execute_async_script(TIMED_RENDER) for _ in range(5)]
    assert all(t.get("status") == 200 and t["workers"] == BIG_FLEET for t in timings), timings
    worst = max(t["fetch_ms"] + t["draw_ms"] for t in timings)
    assert worst < RENDER_BOUND_MS, timings
    names = {r["data"]["worker"] for r in rows(browser, "workers")}
    assert names == {f"sim-{i}" for i in range(BIG_FLEET)}
    explained = read(browser, "[...document.querySelectorAll('#feed td.cands')].map(td => td.textContent)")
    assert explained and all(re.match(r"sim-\d+ [\d.]+ ms \(wait ", text) for text in explained), explained
    status = str(read(browser, "document.getElementById('status').textContent"))
    wait_for(browser, lambda d: read(d, "document.getElementById('status').textContent") != status, 10)
    assert console_errors(browser) == []  # and its own polls go on
