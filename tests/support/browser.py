"""A real browser for the dashboard's tests: Debian's chromium, headless, driven by selenium through the
system's ``/usr/bin/chromedriver`` (``make browser`` installs both; selenium's own manager is kept off,
so nothing is downloaded). Its fleet: ``prefix_router.lab.launch.showcase`` (simulated engines behind a
real router, on a thread of their own: selenium's calls block)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from prefix_router.lab.launch.showcase import ADMIN_TOKEN
from support import needs

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"


def chrome(width: int = 1400, height: int = 1000) -> Any:
    """A headless chromium driven through the system's chromedriver (fails when either is missing)."""
    needs.require("browser")
    if not (os.access(CHROMEDRIVER, os.X_OK) and shutil.which(CHROMIUM)):
        pytest.fail("chromium or chromium-driver is not installed: make browser", pytrace=False)
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager: never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def console_errors(driver: Any) -> list[str]:
    """The page's console errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def sign_in(driver: Any, url: str, token: str = ADMIN_TOKEN) -> None:
    """The login form, filled in as a person does. The form page answers 401 (the browser logs that as
    an error): the log is emptied before the form is sent, so what is read after is the dashboard's. A
    session already there (cookies are per host, not port) is dropped first."""
    from selenium.webdriver.common.by import By

    driver.get(url + "/dashboard")
    if not driver.find_elements(By.ID, "token"):  # signed in already (one cookie for every port)
        driver.delete_all_cookies()
        driver.get(url + "/dashboard")
    console_errors(driver)
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()


def wait_for(driver: Any, check: Callable[[Any], Any], timeout_s: float = 45) -> Any:
    """``check(driver)`` until it is truthy; the page redraws its tables every second, so an element found
    a moment ago may be gone (stale): that counts as not yet."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout_s, poll_frequency=0.1, ignored_exceptions=ignored).until(check)


def read(driver: Any, script: str) -> Any:
    """What ``script`` (a JavaScript expression) evaluates to in the page, read in one go."""
    return driver.execute_script(f"return {script};")
