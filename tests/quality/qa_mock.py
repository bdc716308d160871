"""A mock OpenAI-compatible server for the multiple-choice soak: it reads the lettered choices of
each prompt and answers the right letter (it is told the questions), a random one (seeded), or
in words it knows nothing of (unparsable). Listens on 127.0.0.1 only."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from moetune.quality import qa


@contextmanager
def qa_server(questions: list[qa.Question], mode: str, seed: int = 0) -> Iterator[str]:
    by_prompt = {qa.prompt(q): q for q in questions}
    rng = random.Random(seed)
    seen: list[dict[str, object]] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            q = by_prompt[body["messages"][0]["content"]]
            if mode == "right":
                text = f"{qa.right_letter(q)}."
            elif mode == "random":
                text = rng.choice(q.letters)
            else:
                text = "I would rather not say."
            doc = json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": text}}], "usage": {"completion_tokens": 2}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
