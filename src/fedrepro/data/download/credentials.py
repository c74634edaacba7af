"""Credentials (Kaggle token, PhysioNet login), read from their standard places or the environment, passed only
to the HTTP client (:mod:`.transfer`), and never logged or written anywhere."""

from __future__ import annotations

import json
import netrc
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Credentials:
    username: str
    secret: str

    def __repr__(self) -> str:  # never let a secret reach a log line or a traceback
        return f"Credentials(username={self.username!r}, secret=<hidden>)"


def kaggle_credentials(env: dict | None = None, home: Path | None = None) -> Credentials | None:
    """``KAGGLE_USERNAME``/``KAGGLE_KEY``, else ``$KAGGLE_CONFIG_DIR/kaggle.json`` or ``~/.kaggle/kaggle.json``."""
    env = os.environ if env is None else env
    if env.get("KAGGLE_USERNAME") and env.get("KAGGLE_KEY"):
        return Credentials(env["KAGGLE_USERNAME"], env["KAGGLE_KEY"])
    config_dir = Path(env["KAGGLE_CONFIG_DIR"]) if env.get("KAGGLE_CONFIG_DIR") else (home or Path.home()) / ".kaggle"
    token = config_dir / "kaggle.json"
    if token.is_file():
        data = json.loads(token.read_text())
        if data.get("username") and data.get("key"):
            return Credentials(data["username"], data["key"])
    return None


def physionet_credentials(env: dict | None = None, home: Path | None = None) -> Credentials | None:
    """``PHYSIONET_USERNAME``/``PHYSIONET_PASSWORD``, else the ``physionet.org`` entry of ``~/.netrc``."""
    env = os.environ if env is None else env
    if env.get("PHYSIONET_USERNAME") and env.get("PHYSIONET_PASSWORD"):
        return Credentials(env["PHYSIONET_USERNAME"], env["PHYSIONET_PASSWORD"])
    netrc_path = (home or Path.home()) / ".netrc"
    if netrc_path.is_file():
        entry = netrc.netrc(netrc_path).authenticators("physionet.org")
        if entry and entry[0] and entry[2]:
            return Credentials(entry[0], entry[2])
    return None

