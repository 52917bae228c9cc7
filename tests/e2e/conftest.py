"""What the end-to-end tests share: a real headless Chromium (Debian's, driven by Selenium
through Debian's chromium-driver) for the pages."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
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
    page = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield page
    finally:
        page.quit()
        executor = page.command_executor
        if not isinstance(executor, str):
            executor.close()  # type: ignore[no-untyped-call]  # its pooled connections too


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with headless_chromium("1280,1100") as page:
        yield page
