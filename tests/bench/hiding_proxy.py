"""llama-server as a server without its extras: a proxy that answers ``/tokenize``,
``/apply-template``, ``/props`` and ``/slots`` with vLLM's 404 and passes everything else through
unchanged (streams as they come), so moetune meets a real model's tokenizer and chat template the
way it meets vLLM's. Each request goes upstream on a connection of its own, asked to close after
the answer (which tells the client not to reuse it either).

Run it as ``python tests/bench/hiding_proxy.py --config '{"upstream": "http://127.0.0.1:PORT"}'``;
it prints its URL on the first line of stdout. :func:`hiding_proxy` starts it in a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

HOST = "127.0.0.1"
HIDDEN = ("/tokenize", "/detokenize", "/apply-template", "/props", "/slots")
NOT_FOUND = (
    b'HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 22\r\n\r\n{"detail":"Not Found"}'
)


async def handle(upstream: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = [*lines[0].split(" "), "", ""][1].split("?", 1)[0]
            length = next(
                (int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.strip().lower() == "content-length"),
                0,
            )
            body = await reader.readexactly(length) if length else b""
            if path in HIDDEN:
                writer.write(NOT_FOUND)
                await writer.drain()
                continue
            headers = [h for h in lines[1:] if h and h.partition(":")[0].strip().lower() != "connection"]
            up_r, up_w = await asyncio.open_connection(*upstream)
            up_w.write("\r\n".join([lines[0], *headers, "Connection: close", "", ""]).encode("latin-1") + body)
            await up_w.drain()
            while chunk := await up_r.read(65536):
                writer.write(chunk)
                await writer.drain()
            up_w.close()
            break  # the answer said "Connection: close"
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(upstream: str) -> None:
    u = urlsplit(upstream)
    target = (u.hostname or HOST, u.port or 80)
    srv = await asyncio.start_server(lambda r, w: handle(target, r, w), HOST, 0)
    print(f"http://{HOST}:{srv.sockets[0].getsockname()[1]}", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--config", required=True, help='{"upstream": URL}')
    a = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(json.loads(a.config)["upstream"]))


@contextlib.contextmanager
def hiding_proxy(upstream: str) -> Iterator[str]:
    from tests.bench.mock_process import mock_process  # not at the top: this file also runs as a script

    with mock_process(
        __file__, json.dumps({"upstream": upstream}), url_prefix=f"http://{HOST}:", what="hiding proxy"
    ) as url:
        yield url


if __name__ == "__main__":
    main()
