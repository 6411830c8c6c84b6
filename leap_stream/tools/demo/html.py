"""One self-contained HTML file: the printed report, the plots inlined as base64, the JSON."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

TITLES = {
    "accuracy": "Accuracy: predictions vs measurements",
    "calibration": "Calibration",
    "savings": "Estimated savings",
    "latency": "Latency",
}


def render_html(report: Mapping[str, Any], text: str, images: Mapping[str, Path]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>leap-stream demo report</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;"
        "padding:0 1em;color:#222}pre{background:#f6f8fa;padding:1em;overflow-x:auto;"
        "font-size:13px}img{max-width:100%;border:1px solid #ddd}h2{margin-top:1.6em}</style>",
        "</head><body><h1>leap-stream demo report</h1>",
        "<p>Every figure comes from this run: the simulator's fleet streamed through the real "
        "Kafka broker, Redis and the worker process; accuracy and savings compare the rankings "
        "the worker published with the simulator's measurements and truth.</p>",
        f"<pre>{html.escape(text.strip())}</pre>",
    ]
    for name, path in images.items():
        data = base64.b64encode(Path(path).read_bytes()).decode()
        title = html.escape(TITLES.get(name, name))
        parts.append(
            f"<h2>{title}</h2><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
        )
    body = orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
    parts.append(
        f"<h2>report.json</h2><details><summary>all figures</summary><pre>{html.escape(body)}</pre></details>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


__all__ = ["render_html"]
