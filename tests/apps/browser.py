"""Debian's Chromium under Playwright, for the dashboard's tests and scripts/screenshots.

Never a browser Playwright downloads (`playwright install` is not used): scripts/setup
installs Debian's `chromium` package when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import os
from typing import Any

CHROMIUM = os.environ.get("TETHER_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch(playwright: Any) -> Any:
    """A headless Chromium browser (a playwright.sync_api.Browser)."""
    if not os.path.exists(CHROMIUM):
        raise RuntimeError(f"{CHROMIUM} is missing: run scripts/setup (it installs Debian's "
                           "chromium package)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
