"""Jupyter: a compact HTML summary of a snapshot (``_repr_html_``) and the
HTML report shown inline (:func:`report_html_inline`).

Presentation only: the figures come from the Rust analyses (``summary``,
``doctor``) through the same bridge as every other result.
"""

from __future__ import annotations

import html
import os
import tempfile
import uuid
from typing import Any, Dict, List, Optional

from . import _native

_SEVERITY_COLOR = {"critical": "#c62828", "warning": "#9a5b00", "info": "#0b5cad"}


def format_bytes(n: Optional[int]) -> str:
    """Bytes as the CLI prints them (Rust's ``memlens::units::format_bytes``,
    with a ``-`` before a negative figure); ``–`` for a figure the document
    does not have."""
    if n is None:
        return "–"
    n = int(n)
    return ("-" if n < 0 else "") + _native.format_bytes(abs(n))


def summary_html(path: str, summary: Dict[str, Any], doctor: Dict[str, Any]) -> str:
    """The compact summary: figures of the snapshot and the findings, most
    serious first (as ``memlens doctor`` prints them)."""
    peak = doctor.get("diagnosis", {}).get("peak", {})
    rows = [
        ("file", html.escape(os.path.basename(path))),
        ("peak allocated", format_bytes(peak.get("peak_allocated_bytes"))),
        ("peak reserved", format_bytes(peak.get("peak_reserved_bytes"))),
        ("reserved at dump", format_bytes(summary.get("reserved_bytes"))),
        ("allocated at dump", format_bytes(summary.get("allocated_bytes"))),
        ("segments", str(summary.get("segments", "–"))),
    ]
    cells = "".join(
        f'<tr><th style="text-align:left;padding:1px 10px 1px 0;font-weight:500;color:#57606a">{k}</th>'
        f'<td style="padding:1px 0;font-variant-numeric:tabular-nums">{v}</td></tr>'
        for k, v in rows
    )
    findings: List[Dict[str, Any]] = doctor.get("findings", [])
    items = []
    for f in findings[:8]:
        sev = str(f.get("severity", "info"))
        color = _SEVERITY_COLOR.get(sev, "#57606a")
        items.append(
            f'<li><b style="color:{color};text-transform:uppercase;font-size:11px">{html.escape(sev)}</b> '
            f"{html.escape(str(f.get('title', '')))}</li>"
        )
    more = f"<li>… {len(findings) - 8} more</li>" if len(findings) > 8 else ""
    body = (
        f'<ul style="margin:6px 0 0;padding-left:18px">{"".join(items)}{more}</ul>'
        if items
        else '<p style="margin:6px 0 0;color:#1a7f37">No findings.</p>'
    )
    return (
        '<div class="memlens-summary" style="font:13px/1.45 system-ui,sans-serif;'
        'border:1px solid #d0d7de;border-radius:8px;padding:8px 12px;max-width:760px">'
        '<div style="font-weight:700;letter-spacing:.05em;font-size:11px;color:#57606a">MEMLENS SNAPSHOT</div>'
        f'<table style="border-collapse:collapse;margin-top:4px">{cells}</table>{body}'
        '<div style="margin-top:6px;color:#57606a;font-size:12px">'
        "<code>.show_report()</code> shows the whole report here.</div></div>"
    )


# Picks the notebook's theme for the report before it draws: JupyterLab and
# Notebook 7 mark the page's body (data-jp-theme-light), VS Code its classes,
# Colab the html element. It puts the page, told the theme in its <html
# data-theme> (which the report reads), in a new iframe in place of the first.
# Where the notebook runs no output scripts, or marks no theme, the report
# follows the system's setting, as in a browser.
_THEME_SCRIPT = """<script>(function () {
  var f = document.getElementById('%s');
  if (!f) return;
  var b = document.body, jp = b.getAttribute('data-jp-theme-light'), t = null;
  if (jp === 'true' || jp === 'false') t = jp === 'true' ? 'light' : 'dark';
  else if (b.classList.contains('vscode-dark') || b.classList.contains('vscode-high-contrast')) t = 'dark';
  else if (b.classList.contains('vscode-light')) t = 'light';
  else if (document.documentElement.getAttribute('theme') === 'dark') t = 'dark';
  if (!t) return;
  // A new frame in its place: the first one's page is dropped before it
  // draws, so the report draws once, in the notebook's theme.
  var g = f.cloneNode(false);
  g.srcdoc = f.srcdoc.replace('<html', '<html data-theme="' + t + '"');
  f.replaceWith(g);
})();</script>"""


def themed(report: str, theme: str) -> str:
    """The report page told to draw in ``theme`` (``"dark"`` or ``"light"``)
    whatever the system's setting."""
    if theme not in ("dark", "light"):
        raise ValueError(f"theme must be 'dark', 'light' or None (the notebook's), not {theme!r}")
    return report.replace("<html", f'<html data-theme="{theme}"', 1)


def iframe_html(report: str, height: int = 900, theme: Optional[str] = None) -> str:
    """The report page inside an ``<iframe srcdoc>``: the page is
    self-contained, so the notebook needs no server and no network. It
    follows the notebook's theme (JupyterLab, Notebook 7, VS Code, Colab),
    else the system's; ``theme`` (``"dark"`` or ``"light"``) forces one."""
    if theme is not None:
        report = themed(report, theme)
    frame_id = f"memlens-report-{uuid.uuid4().hex[:12]}"
    frame = (
        f'<iframe id="{frame_id}" srcdoc="{html.escape(report, quote=True)}" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #d0d7de;border-radius:8px" '
        'sandbox="allow-scripts" title="memlens report"></iframe>'
    )
    return frame if theme is not None else frame + _THEME_SCRIPT % frame_id


def write_report_text(snap: Any, others: tuple) -> str:
    """Writes the report of ``snap`` (and ``others``) to a temporary file and
    returns the page's text."""
    fd, path = tempfile.mkstemp(suffix=".memlens.html")
    os.close(fd)
    try:
        snap.report(path, *others)
        with open(path, encoding="utf-8") as f:
            return f.read()
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
