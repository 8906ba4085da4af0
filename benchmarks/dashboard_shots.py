"""The dashboard's screenshots in the docs (``docs/img/dashboard*.png``), made the way a person sees it:
headless chromium (Debian's, through ``/usr/bin/chromedriver``; ``make browser`` installs both, selenium
downloads nothing) signed in through the login form of a router in front of simulated engines with three
tenants' traffic (SIMULATED: ``lab/launch/showcase.py``); one worker drained half way, so that the prefix
map shows its tenants moving, and one killed, so that it shows red. The router routes with ``ttft`` by
default: a policy that explains its decisions (each candidate's predicted first-token time and its parts,
shown in the feed); with one that does not (``--policy prefix``) the candidates column shows "–". The
shots are refused (exit 1) when the policy asked to explain its decisions made none.

    python benchmarks/dashboard_shots.py --out docs/img [--policy ttft]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import orjson

from prefix_router.lab.launch.showcase import ADMIN_TOKEN, showcase

CHROMEDRIVER = "/usr/bin/chromedriver"
EXPLAINING = frozenset({"ttft"})  # policies whose decisions carry per-candidate estimates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=20.0, help="traffic before the shots")
    parser.add_argument("--policy", default="ttft", help="the router's policy (default: ttft)")
    args = parser.parse_args()
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1700"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        settings = {"health.fail_threshold": 1, "routing.policy": args.policy}
        with showcase(args.workers, settings) as fleet:
            fleet.start_traffic(clients=4)
            driver.get(fleet.url + "/dashboard")
            driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
            driver.find_element(By.ID, "sign-in").click()
            time.sleep(args.seconds / 2)
            fleet.admin("POST", "/admin/workers/sim-1/drain")
            time.sleep(args.seconds / 2)
            fleet.kill(f"sim-{args.workers - 1}")
            time.sleep(3)
            explained = explained_decisions(fleet.admin("GET", "/admin/decisions?limit=200")[1])
            if args.policy in EXPLAINING and not explained:
                sys.exit(f"no decision of {args.policy} explained its candidates: no shots taken")
            driver.save_screenshot(str(args.out / "dashboard.png"))
            driver.find_element(By.ID, "prefix-section").screenshot(
                str(args.out / "dashboard-prefix-map.png")
            )
    finally:
        driver.quit()
    print(f"wrote {args.out / 'dashboard.png'} and {args.out / 'dashboard-prefix-map.png'} ({args.policy})")


def explained_decisions(body: bytes) -> int:
    """How many of ``/admin/decisions``' answer carry their candidates' estimates."""
    return sum(1 for d in orjson.loads(body)["decisions"] if d["candidates"])


if __name__ == "__main__":
    main()
