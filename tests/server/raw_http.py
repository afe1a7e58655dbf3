#!/usr/bin/env python3
"""Raw HTTP exchanges for tests/server/http_front_test.cpp, read by Python's own HTTP client.

Reads a JSON spec (the file named by argv[1]):
  {"port": N,
   "send": [{"data": "...", "delay_ms": 0, "expect_continue": false}, ...],
   "methods": ["GET", ...],   # one per response expected, in order
   "timeout": 10}
Sends each piece in turn (after delay_ms); a piece with expect_continue waits first for an
interim "HTTP/1.1 100" line. Then parses one response per method with http.client (chunked,
Content-Length and close-delimited bodies alike) from the one connection, and prints
{"responses": [{"status", "version", "headers", "body"}], "continue": bool, "error": str}.
"""
import http.client
import json
import socket
import sys
import time


class _SharedFile:
    """One buffered reader for every response of the connection (http.client would open a
    new one per response and lose what the first buffered)."""

    def __init__(self, f):
        self._f = f

    def makefile(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return getattr(self._f, name)

    def close(self):
        pass


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = {"responses": [], "continue": False, "error": ""}
    sock = socket.create_connection(("127.0.0.1", spec["port"]), timeout=spec.get("timeout", 10))
    reader = sock.makefile("rb")
    shared = _SharedFile(reader)
    try:
        for piece in spec.get("send", []):
            if piece.get("delay_ms"):
                time.sleep(piece["delay_ms"] / 1000.0)
            if piece.get("expect_continue"):
                line = reader.readline()
                if not line.startswith(b"HTTP/1.1 100"):
                    out["error"] = "no 100 Continue: " + line.decode("latin-1")
                    break
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                out["continue"] = True
            sock.sendall(piece["data"].encode("latin-1"))
        for method in spec.get("methods", []):
            r = http.client.HTTPResponse(shared, method=method)
            r.begin()
            body = r.read()
            out["responses"].append({
                "status": r.status,
                "version": r.version,
                "headers": {k.lower(): v for k, v in r.getheaders()},
                "body": body.decode("utf-8", "replace"),
            })
    except Exception as e:  # reported, the test decides
        out["error"] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
