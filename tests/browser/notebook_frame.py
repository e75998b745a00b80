"""Writes the page a notebook shows for `snap.show_report()` (issue 33: the
report follows the notebook's theme), for tests/browser/jupyter_theme.mjs.

    python notebook_frame.py REPORT.html OUT.html HOST

HOST is the notebook the page imitates: `jupyterlab-dark`, `jupyterlab-light`
(the body's data-jp-theme-light, as JupyterLab and Notebook 7 set it),
`vscode-dark` (the body's class), `plain` (no theme marked: the system's
setting applies). The iframe and its script are memlens's own
(`memlens._notebook.iframe_html`), loaded without the native module.
"""
import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "..", "python", "memlens")

sys.modules["memlens"] = types.ModuleType("memlens")
sys.modules["memlens"].__path__ = [PKG]
sys.modules["memlens._native"] = types.ModuleType("memlens._native")
spec = importlib.util.spec_from_file_location("memlens._notebook", os.path.join(PKG, "_notebook.py"))
notebook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebook)

report, out, host = sys.argv[1:4]
body = {
    "jupyterlab-dark": '<body data-jp-theme-light="false" data-jp-theme-name="JupyterLab Dark">',
    "jupyterlab-light": '<body data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">',
    "vscode-dark": '<body class="vscode-body vscode-dark">',
    "plain": "<body>",
}[host]
with open(report, encoding="utf-8") as f:
    frame = notebook.iframe_html(f.read(), height=600)
with open(out, "w", encoding="utf-8") as f:
    f.write(f"<!doctype html><html><head><meta charset=utf-8></head>{body}"
            f"<div class=\"jp-OutputArea-output\">{frame}</div></body></html>")
