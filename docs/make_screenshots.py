"""Write the README's screenshots of `chatcodec show` pages: docs/show-qwen3.png and docs/show-llama3.png.

Run from the checkout, with ../shared beside it and Debian's chromium installed:
    .venv/bin/python docs/make_screenshots.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.inspect.browser import Browser, find_chromium  # noqa: E402

PAGES = {
    "show-qwen3.png": ["--tokenizer", "../shared/tokenizers/qwen3"],
    "show-llama3.png": ["--tokenizer", "../shared/tokenizers/llama3_1", "--now", "2026-12-01"],
}


def main() -> None:
    binary = find_chromium()
    if binary is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as folder, Browser(binary, width=1100, height=900) as browser:
        for name, options in PAGES.items():
            page = Path(folder) / (name + ".html")
            command = [sys.executable, "-m", "chatcodec", "show", "examples/show.json", *options, "--html", str(page)]
            subprocess.run(command, cwd=ROOT, check=True)
            browser.open(page)
            assert browser.requests() == [page.resolve().as_uri()]
            bottom = browser.evaluate("document.getElementById('messages').getBoundingClientRect().bottom")
            browser.call("Emulation.setDeviceMetricsOverride",
                         {"width": 1100, "height": int(bottom) + 24, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
            browser.screenshot(ROOT / "docs" / name)
            print(f"wrote docs/{name}")


if __name__ == "__main__":
    main()
