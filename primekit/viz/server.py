"""A small local HTTP server (the standard library's) for the sim and dashboard pages.

An app is a dict from (method, path) to a handler taking the request's parameters (the query
string for GET, the JSON body for POST) and returning a JSON-able object, or `(content_type,
bytes)` for anything else. Files under primekit/viz/static are served at /static/...; nothing is
fetched from the internet (the charting library, uPlot, is vendored in static/vendor with its
licence). Handlers run one at a time (one lock per server): the state they touch is small and
the page is for one user.

Answers: a handler's ValueError/KeyError/TypeError (or BadRequest, which adds fields to the
answer) is a 400 `{"error": one line}`; NotFound a 404; an unknown path a 404; anything else a
500 with one line. JSON never carries NaN or Infinity (a non-finite number is a 500).
"""

from __future__ import annotations

import errno
import json
import mimetypes
import threading
import webbrowser
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

STATIC = Path(__file__).parent / "static"

Handler = Callable[[dict[str, Any]], Any]
Routes = dict[tuple[str, str], Handler]


class BadRequest(ValueError):
    """A 400 whose JSON answer carries `fields` beside "error" (e.g. the state as it stands)."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields


class NotFound(LookupError):
    """A 404: what was asked for does not exist here (the message says why)."""


class PortError(ValueError):
    """The port cannot be served: out of range, in use, or not permitted."""


def page(name: str) -> Handler:
    """A handler serving static/<name> (the app's HTML page)."""
    return lambda _params: ("text/html; charset=utf-8", (STATIC / name).read_bytes())


def make_server(routes: Routes, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server bound to host:port (0 = any free port), not yet serving."""
    lock = threading.Lock()

    class RequestHandler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the page polls
            pass

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _handle(self, method: str) -> None:
            url = urlparse(self.path)
            if method == "GET" and url.path.startswith("/static/"):
                self._static(url.path[len("/static/"):])
                return
            handler = routes.get((method, url.path))
            if handler is None:
                self._send(404, "text/plain", f"no route {method} {url.path}".encode())
                return
            try:
                if method == "GET":
                    params = {k: v[-1] for k, v in parse_qs(url.query).items()}
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    params = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(params, dict):
                        raise ValueError("the request body must be a JSON object")
                with lock:
                    out = handler(params)
                body = out[1] if isinstance(out, tuple) else json.dumps(out, allow_nan=False)
            except NotFound as e:
                self._json(404, {"error": str(e)})
                return
            except BadRequest as e:
                self._json(400, {"error": str(e), **e.fields})
                return
            except (ValueError, KeyError, TypeError) as e:  # bad input: a one-line 400
                self._json(400, {"error": str(e.args[0]) if e.args else type(e).__name__})
                return
            except Exception as e:  # noqa: BLE001 - a bug: one line, not a dropped connection
                self._json(500, {"error": f"{type(e).__name__}: {e}"})
                return
            if isinstance(out, tuple):
                self._send(200, out[0], body)
            else:
                self._send(200, "application/json", body.encode())

        def _json(self, status: int, obj: dict) -> None:
            try:
                body = json.dumps(obj, allow_nan=False)
            except ValueError:  # a non-finite number in the extra fields: the line alone
                body = json.dumps({"error": obj["error"]})
            self._send(status, "application/json", body.encode())

        def _static(self, rel: str) -> None:
            path = (STATIC / rel).resolve()
            if STATIC.resolve() not in path.parents or not path.is_file():
                self._send(404, "text/plain", b"not found")
                return
            kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            self._send(200, kind, path.read_bytes())

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

    return ThreadingHTTPServer((host, port), RequestHandler)


def bind(routes: Routes, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server bound to host:port, or PortError with one line: an invalid port, one in use, one
    not permitted. The servers take their port first, before any other work."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise PortError(f"--port must be 0 (any free port) to 65535, got {port}")
    try:
        return make_server(routes, port, host)
    except OSError as e:
        why = {errno.EADDRINUSE: "is in use (another server, perhaps another primekit page)",
               errno.EACCES: "needs privileges this user lacks"}.get(e.errno, f"failed: {e}")
        raise PortError(f"port {port} on {host} {why}; pick another with --port P "
                        "(--port 0: any free port)") from None


def serve(routes: Routes, port: int, open_browser: bool, what: str) -> None:
    """Take the port, then serve until Ctrl-C (see `serve_bound`)."""
    serve_bound(bind(routes, port), open_browser, what)


def serve_bound(server: ThreadingHTTPServer, open_browser: bool, what: str) -> None:
    """Serve until Ctrl-C, printing the URL (and opening it unless told not to)."""
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"primekit {what}: {url}  (Ctrl-C to stop)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_in_thread(routes: Routes, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """For tests: a server on a free port, serving in a daemon thread; returns it and its URL."""
    server = make_server(routes, port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"
