"""Generated blocks of the docs: a measurement script writes its table between two markers,
``<!-- <name>:start -->`` and ``<!-- <name>:end -->``, so the numbers in the docs are the ones the script printed
(with the date and the command in the block's first line) and a test can read them back."""

from __future__ import annotations

import re
from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def block_of(text: str, name: str) -> str | None:
    """The text between the markers of ``name`` (None: no such block)."""
    start, end = markers(name)
    match = re.search(re.escape(start) + r"\n(.*?)\n?" + re.escape(end), text, re.S)
    return match.group(1) if match else None


def replace_block(path: str | Path, name: str, body: str) -> None:
    """Replace (or append) the block ``name`` of ``path`` with ``body``."""
    path = Path(path)
    start, end = markers(name)
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
