"""The HTML report: one self-contained page (works offline) plus the data it is drawn from.

`_write.py` holds the public entry points, `write_report(out_dir, results, ...)`, `render_report(out_dir)` and
`save_report_data` (the data alone, drawn later by `render_report`);
`_data.py` saves and loads what the page is drawn from (`WatchResults` as safetensors, metadata, summary and
findings as JSON, weight histograms as safetensors; never pickles); `_html.py` builds the page from `plot`
figures embedded as base64 PNG (no script, no CDN, a Content-Security-Policy that forbids both); `_escape.py`
makes every name inert (HTML-escaped, bidi and control characters shown as `<U+XXXX>`) and file names safe.
The CLI (`hookscope demo`, `run`, `report`) writes its reports through here.
"""

from ._write import remove_report, render_report, save_report_data, write_report

__all__ = ["remove_report", "render_report", "save_report_data", "write_report"]
