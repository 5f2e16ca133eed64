"""The documentation site: it builds in strict mode (a broken link, a missing reference or a
docstring warning fails), it needs no network, and in headless Chromium its pages render with
the navigation and highlighted code (tools/docs/browser.py). Skipped, with the reason, where the
docs extra or Chromium is missing; scripts/test.sh installs both."""
from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCREENSHOTS = os.path.join(ROOT, "docs", "screenshots")


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


browser = _load("_accord_docs_browser", os.path.join(ROOT, "tools", "docs", "browser.py"))
hooks = _load("_accord_docs_hooks", os.path.join(ROOT, "tools", "docs", "hooks.py"))


def _docs_extra_missing() -> str:
    missing = [m for m in ("mkdocs", "material", "mkdocstrings_handlers.python") if importlib.util.find_spec(m) is None]
    return ", ".join(missing)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    missing = _docs_extra_missing()
    if missing:
        pytest.skip(f"the docs extra is not installed ({missing} missing): pip install -e '.[docs]' "
                    "(scripts/test.sh installs it)")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           os.path.join(ROOT, "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return str(out)


@pytest.mark.timeout(300)
def test_the_site_builds_strict_with_every_page_and_plot(site):
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        nav_pages = [line.split(": ", 1)[1].strip() for line in fh
                     if line.strip().startswith("- ") and line.rstrip().endswith(".md")]
    assert len(nav_pages) >= 30, nav_pages
    for page in nav_pages:
        assert os.path.exists(os.path.join(site, page[:-len(".md")] + ".html")), page
    for plot in hooks.PLOTS:  # drawn from the recorded JSON at build time
        with open(os.path.join(site, plot), "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n", plot
    with open(os.path.join(site, "reference", "cli.html"), encoding="utf-8") as fh:
        cli = fh.read()
    for program in ("accordrun", "accord-bench", "accord-mxnet-launch"):
        assert f"usage: {program}" in cli, program
    assert hooks.help_text("accordrun").splitlines()[0] in cli


# A few names per reference page that mkdocstrings must have rendered from the docstrings.
REFERENCE = {
    "torch": ["accord.torch.allreduce", "accord.torch.DistributedOptimizer", "accord.torch.elastic.run"],
    "mxnet": ["accord.mxnet.DistributedTrainer", "accord.mxnet.allreduce"],
    "kvstore": ["accord.kvstore.create", "accord.kvstore.base.KVStoreBase.push"],
    "data": ["accord.data.samplers.DistributedSampler", "accord.data.split_batch"],
    "hapi": ["accord.hapi.Model.fit", "accord.hapi.Accuracy"],
    "run": ["accord.run.functions.spawn.spawn", "accord.run.functions.horovod_run.run"],
}


@pytest.mark.timeout(300)
def test_the_api_reference_is_generated_with_arguments(site):
    for page, names in REFERENCE.items():
        with open(os.path.join(site, "reference", f"{page}.html"), encoding="utf-8") as fh:
            html = fh.read()
        for name in names:
            assert f'id="{name}"' in html, (page, name)
    with open(os.path.join(site, "reference", "torch.html"), encoding="utf-8") as fh:
        torch_page = fh.read()
    allreduce = torch_page[torch_page.index('id="accord.torch.allreduce"'):]
    allreduce = allreduce[:allreduce.index('class="doc doc-object doc-function"', 1)]
    for section in ("Parameters:", "Returns:", "Raises:", "process_set"):  # the docstring's sections
        assert section in allreduce, section


@pytest.mark.timeout(300)
def test_no_page_fetches_anything_from_another_host(site):
    pages = glob.glob(os.path.join(site, "**", "*.html"), recursive=True)
    assert len(pages) > 30
    remote = {}
    for page in pages:
        with open(page, encoding="utf-8") as fh:
            found = browser.remote_assets(fh.read())
        if found:
            remote[os.path.relpath(page, site)] = found
    assert remote == {}


def test_the_remote_asset_finder_finds_fonts_and_scripts():
    html = ('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
            '<script src="//cdn.example/x.js"></script><link href="assets/main.css">')
    assert browser.remote_assets(html) == ["https://fonts.googleapis.com/css?family=Roboto", "//cdn.example/x.js"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(browser.PAGES))
def test_pages_render_with_navigation_and_highlighted_code(site, kind):
    if browser.chromium() is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; scripts/setup_env.sh does)")
    page = browser.PAGES[kind]
    seen = browser.look(site, page)
    assert seen["probe_ran"], seen
    assert 100 < seen["nav_width"] < 400, seen      # a sidebar (unstyled, the list takes the full width)
    prefix = "../" * page.count("/")
    for target in ("getting-started.html", "from-horovod.html", "troubleshooting.html", "reference/torch.html"):
        assert prefix + target in seen["nav_links"] or target.split("/")[-1] in seen["nav_links"], (target, seen)
    if kind != "home":  # the home page has no code
        assert seen["copy_buttons"] > 0, seen       # Material's JavaScript ran
        assert len(seen["token_colors"]) >= 3, seen  # the stylesheet colours the code's tokens


def test_one_small_screenshot_per_page_type_is_kept():
    """docs/screenshots/: `python tools/docs/browser.py site --screenshots docs/screenshots`."""
    for kind in browser.PAGES:
        path = os.path.join(SCREENSHOTS, f"{kind}.png")
        with open(path, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n", path
        assert os.path.getsize(path) < 150_000, path
