"""The browser playground in headless Chromium: type a prompt, stream a reply, see tokens/s."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

webdriver = pytest.importorskip("selenium.webdriver")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs Debian's chromium and chromium-driver")


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,860"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def test_prompt_streams_and_shows_speed(server, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: "ready" in d.find_element(By.ID, "status").text)
    assert [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#model-a option")] == \
        ["tiny"]
    max_tokens = browser.find_element(By.ID, "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys("48")
    browser.find_element(By.ID, "prompt").send_keys("def fibonacci(n):")
    browser.find_element(By.ID, "run").click()
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#out-a .finish b").text != "–")
    text = browser.find_element(By.CSS_SELECTOR, "#out-a .text").text
    tps = browser.find_element(By.CSS_SELECTOR, "#out-a .tps b").text
    ntok = browser.find_element(By.CSS_SELECTOR, "#out-a .ntok b").text
    assert text and float(tps) > 0 and int(ntok) >= 1
    shot = Path(os.environ.get("SPARSELLM_SCREENSHOT_DIR", tmp_path)) / "playground.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_chat_side_by_side(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: "ready" in d.find_element(By.ID, "status").text)
    browser.find_element(By.ID, "mode-chat").click()
    browser.find_element(By.ID, "side-by-side").click()
    browser.find_element(By.ID, "prompt").send_keys("Hello!")
    browser.find_element(By.ID, "run").click()
    for box in ("out-a", "out-b"):
        wait.until(lambda d, box=box: d.find_element(By.CSS_SELECTOR,
                                                     f"#{box} .finish b").text != "–")
        assert browser.find_element(By.CSS_SELECTOR, f"#{box} .tps b").text != "–"
    assert "user: Hello!" in browser.find_element(By.ID, "chat-log").text
