"""A local HTTP file server for download tests: ranges, cut connections, refusals, JSON listings,
redirects (Kaggle's API answers with a redirect to its storage) and ETags with If-Range."""

from __future__ import annotations

import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        srv = self.server
        path = urlsplit(self.path).path
        srv.seen.append({"path": self.path, "range": self.headers.get("Range"), "auth": self.headers.get("Authorization"),
                         "if_range": self.headers.get("If-Range")})
        if path in srv.denied:
            self.send_response(401)
            self.end_headers()
            return
        if path in srv.redirects:
            self.send_response(302)
            self.send_header("Location", srv.url + srv.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in srv.json:
            body = json.dumps(srv.json[path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path not in srv.files:
            self.send_response(404)
            self.end_headers()
            return
        data, start = srv.files[path], 0
        etag = srv.etags.get(path)
        unchanged = self.headers.get("If-Range") in (None, etag)
        if self.headers.get("Range") and unchanged:
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        if etag:
            self.send_header("ETag", etag)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = srv.cut.pop(path, None)
        self.wfile.write(body[:cut] if cut else body)
        if cut:
            self.close_connection = True  # the client sees a short body: an interrupted download


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.files, srv.json, srv.cut, srv.denied, srv.seen, srv.redirects, srv.etags = {}, {}, {}, set(), [], {}, {}
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
