"""Open a page in headless Chromium (Debian's chromium + chromium-driver) and look at what rendered."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGES = ("chromium", "chromium-driver")


def chromium_driver():
    """A headless Chromium WebDriver; installs Debian's packages when running as root, else skips."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.geteuid() != 0:
            pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=env, stdout=subprocess.DEVNULL)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def rendered(page: Path, screenshot: Path) -> dict:
    """Load ``page``; -> what rendered: its images (loaded or broken), table ids, row counts and where each table ends
    (``bottom``, against the window's height ``viewport``: on the first screen or not)."""
    driver = chromium_driver()
    try:
        driver.get(page.resolve().as_uri())
        state = driver.execute_script("""
            const imgs = Array.from(document.images).map(i => ({src: i.getAttribute('src'), id: i.id,
                ok: i.complete && i.naturalWidth > 0, width: i.naturalWidth}));
            const tables = Array.from(document.querySelectorAll('table')).map(t => ({id: t.id,
                rows: t.querySelectorAll('tbody tr').length, bottom: t.getBoundingClientRect().bottom}));
            return {images: imgs, tables: tables, text: document.body.innerText, viewport: window.innerHeight};""")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot))
        return state
    finally:
        driver.quit()
