"""The HTML the report pages share: self-contained pages (figures as data URIs, so a page works on its own, in a
mail or inside another report) and Markdown pipe tables as HTML tables."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 1em}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
         "p.caption,figcaption{font-size:13px;max-width:1100px;margin:1.2em 0 .3em}figure{margin:1em 0}"
         ".warning{background:#fff3cd;border:1px solid #e0c060;padding:6px 10px}"
         "#summary td{vertical-align:top}.chip{display:inline-block;margin:1px 3px 1px 0;padding:0 5px;border-radius:3px;"
         "font-size:12px;white-space:nowrap}p.legend{font-size:12px;color:#444;margin-top:.2em}a.top{font-size:12px;"
         "font-weight:normal}")


def data_uri(path: str | Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode('ascii')}"


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def inline(text: str) -> str:
    """A line of the Markdown the pages write as HTML: escaped, ``**bold**`` dropped, ``[text](target)`` a link."""
    escaped = html.escape(text).replace("**", "")
    return _LINK.sub(lambda m: f"<a href='{m.group(2)}'>{m.group(1)}</a>", escaped)


def cell(text: str) -> str:
    """A Markdown table cell as HTML: escaped, its ``<br>`` line breaks kept and ``**bold**`` dropped."""
    return "<br>".join(html.escape(part.strip().replace("**", "")) for part in text.split("<br>"))


def pipe_table(lines: list[str], attrs: str = "") -> str:
    """A Markdown pipe table (header, ``|---|`` rule, rows) as an HTML table, the first row as its header."""
    rows = [[c for c in line.strip().strip("|").split("|")] for line in lines
            if line.strip() and not set(line.strip()) <= set("|-: ")]
    if not rows:
        return ""
    head, *body = rows
    return (f"<table{attrs}><tr>" + "".join(f"<th>{cell(c)}</th>" for c in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in body) + "</table>")
