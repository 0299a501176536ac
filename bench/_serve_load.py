"""The load of ``sparseps bench serve``: keep-alive HTTP/1.1 clients on one asyncio loop.

Each client is one connection that posts the same request again and again and times each
answer. Raw asyncio streams, not an HTTP library: 64 clients as threads of httpx cost
the bench process more CPU than the service it measures on a small machine, and the
figures would be the client's. The answer is read by its ``Content-Length`` (or its
chunks) and its status checked.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit


def request_bytes(url: str, body: bytes, content_type: str, path: str = "/predict") -> bytes:
    host = urlsplit(url).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if "content-length" in headers:
        return status, await reader.readexactly(int(headers["content-length"]))
    parts = []  # chunked
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, b"".join(parts)
        parts.append(chunk[:-2])


async def _client(
    url: str, request: bytes, seconds: float, start: asyncio.Event, ready: list, out: list
) -> None:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)  # connect + warm
        status, body = await _answer(reader)
        if status != 200:
            raise RuntimeError(f"{url}: {status} {body[:300]!r}")
        ready.append(1)
        await start.wait()
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            began = time.perf_counter()
            writer.write(request)
            status, body = await _answer(reader)
            out.append(time.perf_counter() - began)
            if status != 200:
                raise RuntimeError(f"{url}: {status} {body[:300]!r}")
    finally:
        writer.close()


def load(url: str, request: bytes, clients: int, seconds: float) -> tuple[list[float], float]:
    """Latencies (s) of every request ``clients`` connections sent in ``seconds`` (after
    each connected and got one answer), and the wall time of that window."""

    async def run() -> tuple[list[float], float]:
        start = asyncio.Event()
        out: list[float] = []
        ready: list[int] = []
        tasks = [asyncio.create_task(_client(url, request, seconds, start, ready, out))
                 for _ in range(clients)]  # fmt: skip
        deadline = time.monotonic() + 120
        while len(ready) < clients and time.monotonic() < deadline:  # connected, warmed
            if any(t.done() for t in tasks):
                break  # one failed: gather raises its error
            await asyncio.sleep(0.01)
        began = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        return out, time.perf_counter() - began

    return asyncio.run(run())
