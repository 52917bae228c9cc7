"""What the end-to-end tests share: a real headless Chromium (Debian's, driven by Selenium
through Debian's chromium-driver) for the pages."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver


@contextmanager
def headless_chromium(window: str, who: str = "the dashboard tests") -> Iterator[WebDriver]:
    """Debian's headless Chromium in a window of ``window`` ("WIDTH,HEIGHT"), quit on exit."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium, f"{who} need Debian's chromium (.ci/ensure-packages)"
    assert driver, f"{who} need Debian's chromium-driver (.ci/ensure-packages)"
    options = Options()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={window}",
    ):
        options.add_argument(flag)
    # Chromium leaves a folder of its own in TMPDIR at each start (org.chromium.Chromium.*)
    with tempfile.TemporaryDirectory(prefix="swapgate-chromium-") as scratch:
        service = Service(driver, env={**os.environ, "TMPDIR": scratch})
        page = webdriver.Chrome(service=service, options=options)
        try:
            yield page
        finally:
            page.quit()
            executor = page.command_executor
            if not isinstance(executor, str):
                executor.close()  # type: ignore[no-untyped-call]  # its pooled connections too


WINDOW = (1280, 1100)


@pytest.fixture(scope="module")
def chromium() -> Iterator[WebDriver]:
    """One Chromium for a file's page tests: a start is ~0.6 s of CPU and 1-2 s of a busy
    machine's time, and the dashboard's file has a dozen tests."""
    with headless_chromium(",".join(map(str, WINDOW))) as page:
        yield page


@pytest.fixture
def browser(chromium: WebDriver) -> Iterator[WebDriver]:
    """The file's Chromium, as a new one would be: each test's gateway is another origin (its
    own port), so it finds no token kept; after it, the page is left (its event stream
    closed), an alert it left open dismissed and the window sized back."""
    yield chromium
    with contextlib.suppress(NoAlertPresentException):
        chromium.switch_to.alert.dismiss()
    chromium.get("about:blank")
    chromium.delete_all_cookies()
    chromium.set_window_size(*WINDOW)
