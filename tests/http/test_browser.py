"""The memory browser driven by a real headless Chromium (Debian's chromium and chromium-driver, through Selenium) on
a uvicorn server over a real store: the page asks for the token, adds memories, lists a namespace newest first,
searches and shows each hit's score and tier and the search's rule and time, deletes after a confirmation, and
charts the store's stats. Without Chromium it skips, except where TR_REQUIRE_BROWSER=1 (CI sets it) makes that a
failure. TR_BROWSER_SCREENSHOT=docs/http-browser.png keeps the screenshot it takes."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from http_helpers import ADMIN, scoped_settings
from tiered_recall.http import create_app

SCREENSHOT = os.environ.get("TR_BROWSER_SCREENSHOT")


def _chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture
def browser():
    """A headless Chromium driven through its chromedriver (never downloaded: Debian's packages)."""
    found = _chromium()
    if found is None:
        message = "Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("TR_REQUIRE_BROWSER") == "1":
            pytest.fail(message + ", and TR_REQUIRE_BROWSER=1 asks for the browser test")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,800", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=found[1]), options=options)
    yield driver
    driver.quit()


def _wait(driver, condition, what: str, timeout: float = 20):
    """Until condition(driver) is true. The page redraws what it polls (the stats and their chart): a condition that
    meets an element replaced since it was found is tried again at the next poll, not failed."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,)
                         ).until(lambda d: condition(d), message=what)


def test_the_page_adds_lists_searches_deletes_and_charts(browser, text_store, serve, tmp_path):
    from selenium.webdriver.common.by import By

    server = serve(create_app(text_store, settings=scoped_settings()))
    browser.get(f"{server.url}/?poll=0.5")
    by_id = browser.find_element

    # the server asks for a token: the page asks the user
    _wait(browser, lambda d: by_id(By.ID, "token-dialog").is_displayed(), "the token dialog")
    by_id(By.ID, "token-input").send_keys(ADMIN)
    by_id(By.ID, "token-save").click()
    _wait(browser, lambda d: "memories" in by_id(By.ID, "namespaces-total").text, "the namespaces after the token")
    assert browser.execute_script("return sessionStorage.getItem('tiered-recall-token')") == ADMIN

    # add three memories through the form
    by_id(By.CSS_SELECTOR, "#add-panel summary").click()
    for text, role in (("My cat is called Miso", "user"), ("The review moved to the 21st", "user"),
                       ("Ana is vegetarian", "assistant")):
        by_id(By.ID, "add-namespace").clear()
        by_id(By.ID, "add-namespace").send_keys("users/alice")
        by_id(By.ID, "add-role").clear()
        by_id(By.ID, "add-role").send_keys(role)
        by_id(By.ID, "add-text").send_keys(text)
        by_id(By.ID, "add-go").click()
        _wait(browser, lambda d: by_id(By.ID, "add-text").get_attribute("value") == "", f"the add of {text!r}")
    assert by_id(By.ID, "add-status").text.startswith("added ")
    assert text_store.count("users/alice") == 3

    # the namespace is listed with its count; opened, its memories come newest first
    entry = '#namespaces li[data-namespace="users/alice"]'
    _wait(browser, lambda d: "3" in by_id(By.CSS_SELECTOR, entry).text, "users/alice listed with 3 memories")
    by_id(By.CSS_SELECTOR, f"{entry} button").click()
    rows = lambda: by_id(By.ID, "memories").find_elements(By.CSS_SELECTOR, "tbody tr")  # noqa: E731
    _wait(browser, lambda d: len(rows()) == 3 and "users/alice" in by_id(By.ID, "memories-title").text,
          "the namespace's memories")
    assert [r.find_elements(By.TAG_NAME, "td")[3].text for r in rows()] == [
        "Ana is vegetarian", "The review moved to the 21st", "My cat is called Miso"]

    # search: each hit's score and tier, the search's rule and time
    by_id(By.ID, "search-query").send_keys("what is the cat called?")
    by_id(By.ID, "search-k").clear()
    by_id(By.ID, "search-k").send_keys("2")
    by_id(By.ID, "search-go").click()
    hits = lambda: by_id(By.ID, "search-results").find_elements(By.CSS_SELECTOR, "tbody tr")  # noqa: E731
    _wait(browser, lambda d: len(hits()) == 2, "two hits")
    first = hits()[0].find_elements(By.TAG_NAME, "td")
    assert first[5].text == "My cat is called Miso"
    # a staged text search's score: the scaled cosine (0 to 1) plus what the stages add (docs/recall.md)
    assert 0 < float(first[1].text) <= 2.7 and first[2].text in ("hot", "cold")
    meta = by_id(By.ID, "search-meta").text
    assert meta.startswith("2 hits · rule ") and " ms in the store" in meta

    # delete the hit, after the confirmation
    hits()[0].find_element(By.CSS_SELECTOR, "button.delete").click()
    alert = _wait(browser, lambda d: d.switch_to.alert, "the confirmation")
    assert "My cat is called Miso" in alert.text
    alert.accept()
    _wait(browser, lambda d: len(rows()) == 2, "the memory gone from the list")
    _wait(browser, lambda d: all("Miso" not in h.text for h in hits()), "the memory gone from the hits")
    assert text_store.count("users/alice") == 2
    # a dismissed confirmation deletes nothing
    rows()[0].find_element(By.CSS_SELECTOR, "button.delete").click()
    _wait(browser, lambda d: d.switch_to.alert, "the second confirmation").dismiss()
    assert text_store.count("users/alice") == 2 and len(rows()) == 2

    # the stats and their chart, polled while searches run
    for _ in range(3):
        by_id(By.ID, "search-go").click()
        _wait(browser, lambda d: "hits · rule" in by_id(By.ID, "search-meta").text, "a search")
        browser.execute_script("return new Promise((done) => setTimeout(done, 600))")
    _wait(browser, lambda d: by_id(By.CSS_SELECTOR, '#stats dd[data-stat="memories"]').text == "2",
          "the stats' memory count")
    _wait(browser, lambda d: len(by_id(By.ID, "chart").find_elements(By.CSS_SELECTOR, "polyline")) >= 2,
          "the chart's lines", timeout=30)
    assert "% hot" in by_id(By.ID, "chart-line").text and by_id(By.ID, "error-line").text == ""

    shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "browser.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
