"""Look at the built documentation site as a reader would: headless Chromium (Debian's package).

    python tools/docs/browser.py site                      # check the pages, print what was seen
    python tools/docs/browser.py site --screenshots docs/screenshots   # and keep screenshots

The site is served on a free loopback port for the time of the check. :func:`look` loads a copy of
a page with a small script added that, once the page has run its own JavaScript, records what the
reader sees: the colours the stylesheet gives the tokens of the code blocks (one colour: no
highlighting), whether the navigation sidebar takes room on the screen, its links, and
the copy buttons Material's JavaScript adds to code blocks (none: the JavaScript did not run).
It also lists every stylesheet, script or font the page would fetch from another host (the site
must need no network). Nothing is written outside the folders given.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Iterator

# What a check and a screenshot look at: the page types of the site.
PAGES = {"home": "index.html", "guide": "from-horovod.html", "reference": "reference/torch.html"}
WINDOW = (1300, 860)  # wide enough for Material's navigation sidebar (it shows from 1220 px)

_PROBE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const nav = document.querySelector(".md-sidebar--primary .md-nav--primary");
  const box = nav ? nav.getBoundingClientRect() : null;
  const out = {
    token_colors: [...new Set([...document.querySelectorAll(".highlight code span[class]")].slice(0, 400)
                                .map(e => getComputedStyle(e).color))],
    nav_width: box ? box.width : 0,
    nav_links: [...document.querySelectorAll(".md-nav--primary a.md-nav__link")].map(a => a.getAttribute("href")),
    copy_buttons: document.querySelectorAll(".md-code__button").length,
    title: document.title,
  };
  const pre = document.createElement("pre");
  pre.id = "accord-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 200));
</script>
"""
_PROBED = re.compile(r'<pre id="accord-probe">(.*?)</pre>', re.S)
_REMOTE = re.compile(r'<(?:link|script|img)\b[^>]*?(?:href|src)="((?:https?:)?//[^"]+)"', re.I)


def chromium() -> str | None:
    """The Chromium program on PATH (Debian: ``chromium``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: D401 - the check prints what matters
        pass


@contextlib.contextmanager
def serve(folder: str) -> Iterator[str]:
    """Serve ``folder`` on a free port of 127.0.0.1; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=folder))
    thread = threading.Thread(target=server.serve_forever, name="docs-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _chromium(args: list[str], timeout: float) -> str:
    program = chromium()
    if program is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="accord-chromium-") as profile:
        proc = subprocess.run(
            [program, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", *args],
            capture_output=True, text=True, timeout=timeout, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def remote_assets(html: str) -> list[str]:
    """The stylesheets, scripts and images ``html`` would fetch from another host."""
    return _REMOTE.findall(html)


def look(site: str, page: str, timeout: float = 60) -> dict:
    """What a reader of ``page`` (a path under ``site``) sees; see the module's docstring."""
    with open(os.path.join(site, page), encoding="utf-8") as fh:
        html = fh.read()
    probe_name = page[:-len(".html")] + ".probe.html"
    with open(os.path.join(site, probe_name), "w", encoding="utf-8") as fh:
        fh.write(html.replace("</body>", _PROBE + "</body>"))
    try:
        with serve(site) as base:
            dom = _chromium(["--dump-dom", base + probe_name], timeout)
    finally:
        os.remove(os.path.join(site, probe_name))
    m = _PROBED.search(dom)
    seen = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")) if m else {}
    seen["probe_ran"] = m is not None
    seen["remote_assets"] = remote_assets(html)
    return seen


def screenshot(site: str, page: str, path: str, timeout: float = 60) -> None:
    """A PNG of ``page``'s first screen at :data:`WINDOW`, made small (256 colours)."""
    with serve(site) as base:
        _chromium([f"--screenshot={os.path.abspath(path)}", base + page], timeout)
    try:
        from PIL import Image
    except ImportError:  # a full-colour PNG is still a screenshot
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", help="the built site (bash scripts/docs.sh writes site/)")
    parser.add_argument("--screenshots", metavar="DIR", help="also write one PNG per page type here")
    args = parser.parse_args(argv)
    for kind, page in PAGES.items():
        print(kind, page, json.dumps(look(args.site, page)))
        if args.screenshots:
            os.makedirs(args.screenshots, exist_ok=True)
            screenshot(args.site, page, os.path.join(args.screenshots, f"{kind}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
