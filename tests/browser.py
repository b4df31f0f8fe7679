"""Headless Chromium for tests: the rendered DOM of a page, and a screenshot of it.

Tests assert on what a browser built (plotly's SVG, the dashboard's React tree), not on
the HTML text we wrote. Chromium runs as a child in its own process group with a fresh
profile and no network chatter (this machine is offline and may run as root), and is
killed and reaped on every path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from html.parser import HTMLParser

from tuner.paths import REPO_ROOT

ARTIFACTS = REPO_ROOT / "reports" / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no Chromium found; install it with `apt-get install chromium`")


def _run(args: list[str], timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, f"chromium exited with {proc.returncode}"
    return out


def render(
    url: str,
    screenshot: str | None = None,
    size: tuple[int, int] = (1400, 2400),
    budget_ms: int = 8000,
    timeout_s: float = 120,
) -> Element:
    """The parsed DOM after ``budget_ms`` of virtual time (scripts ran, plots drawn).

    With ``screenshot``, the same load also leaves a PNG of that name under
    reports/test-artifacts/ (ignored by git): one browser start for both.
    """
    args = [f"--virtual-time-budget={budget_ms}", "--dump-dom", f"--window-size={size[0]},{size[1]}"]
    path = None
    if screenshot:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / screenshot
        path.unlink(missing_ok=True)
        args.append(f"--screenshot={path}")
    root = parse(_run([*args, url], timeout_s))
    if path is not None:
        assert path.is_file() and path.stat().st_size > 0, f"chromium wrote no screenshot to {path}"
    return root


class Element:
    """A parsed DOM element: tag, attributes, children (text is kept on ``text``)."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.text = ""

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self):
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        return [e for e in self.iter() if (tag is None or e.tag == tag) and (cls is None or cls in e.classes)]

    def by_id(self, element_id: str) -> Element | None:
        return next((e for e in self.iter() if e.attrs.get("id") == element_id), None)

    def all_text(self) -> str:
        return "".join(e.text for e in self.iter())


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {}, None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs}, self.current)
        self.current.children.append(element)
        if tag not in VOID:
            self.current = element

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data):
        if self.current.tag not in ("script", "style"):
            self.current.text += data


def parse(dom: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(dom)
    return builder.root
