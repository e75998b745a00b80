"""Jupyter: a loaded snapshot renders as a compact HTML summary with the
diagnosis' own figures, and the report can be shown inline (issue 18 item 6)."""

from __future__ import annotations

import html
import json
import re

import pytest

import memlens
from memlens._notebook import format_bytes, iframe_html


def test_repr_html_shows_the_peaks_and_every_finding_title(fixtures_dir):
    snap = memlens.load(fixtures_dir / "oom.pickle.zst")
    page = snap._repr_html_()
    d = snap.doctor().to_dict()
    peak = d["diagnosis"]["peak"]
    assert "oom.pickle.zst" in page
    assert format_bytes(peak["peak_allocated_bytes"]) in page
    assert format_bytes(peak["peak_reserved_bytes"]) in page
    assert format_bytes(snap.summary().reserved_bytes) in page
    for f in d["findings"][:8]:
        assert html.escape(f["title"]) in page
    assert page.count("<li>") == min(len(d["findings"]), 8) + (len(d["findings"]) > 8)


def test_format_bytes_matches_the_cli():
    assert format_bytes(1000 << 20) == "1000.00 MiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(-(3 << 30)) == "-3.00 GiB"


def test_report_inline_is_the_whole_self_contained_page(fixtures_dir):
    snap = memlens.load(fixtures_dir / "oom.pickle.zst")
    page = snap.report_html()
    data = json.loads(
        re.search(r'<script type="application/json" id="memlens-data">(.*?)</script>', page, re.S).group(1)
    )
    assert data["oom"]["requested_bytes"] == 1000 << 20
    frame = iframe_html(page, height=700)
    assert frame.startswith('<iframe id="memlens-report-') and "height:700px" in frame
    # The page is escaped into the attribute: no raw tag closes the iframe
    # early; the one script after it picks the notebook's theme.
    iframe, script = frame.split("</iframe>")
    assert "</script>" not in iframe and "<script" not in iframe
    assert script.count("</script>") == 1 and "data-jp-theme-light" in script
    # A forced theme needs no script: the page is told in its <html> tag.
    dark = iframe_html(page, theme="dark")
    assert "<script" not in dark.split("</iframe>")[1]
    assert 'data-theme="dark"' in html.unescape(dark)
    with pytest.raises(ValueError):
        iframe_html(page, theme="blue")
    ipython = pytest.importorskip("IPython.display")
    shown = snap.show_report()
    assert isinstance(shown, ipython.HTML) and "memlens-data" in html.unescape(shown.data)
