"""A picture of a page for the guide: headless Chromium's screenshot of a file or URL, optionally cut to
a band of rows, so the guide's pictures of ``report.html`` and the exported web page can be shot again
from today's code.

    python scripts/page_screenshot.py runs/seen/report.html docs/report_top.png --size 1100,1400 --rows 0,900
    python scripts/page_screenshot.py http://127.0.0.1:8000/index.html docs/web_export.png --wait 20000

Needs Chromium (Debian's ``chromium``); runs as root without a sandbox and reaches nothing outside the
machine, as the tests' browser does.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page", help="an HTML file or a URL")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("--size", default="1100,1400", help="window WIDTH,HEIGHT in px (the whole shot)")
    p.add_argument("--rows", default=None, help="TOP,BOTTOM: keep these rows of the shot")
    p.add_argument("--wait", type=int, default=5000, help="virtual time (ms) the page may run before the shot")
    args = p.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        p.error("no chromium on PATH: apt-get install chromium")
    url = args.page if "://" in args.page else Path(args.page).resolve().as_uri()
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--window-size={args.size}",
                f"--virtual-time-budget={args.wait}",
                f"--screenshot={shot}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        img = Image.open(shot)
        if args.rows:
            top, bottom = (int(v) for v in args.rows.split(","))
            img = img.crop((0, top, img.width, min(bottom, img.height)))
        img.save(args.out, optimize=True)
    print(f"{args.out}: {img.width}x{img.height}")


if __name__ == "__main__":
    main()
