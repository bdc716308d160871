"""A plan's server argv as llama-perplexity's: one rule drops the serving flags."""

from __future__ import annotations

from moetune.quality.kld import base_size_bytes, perplexity_argv


def test_perplexity_argv_keeps_placement_drops_serving() -> None:
    server = [
        "-m",
        "/m.gguf",
        "-c",
        "131072",
        "--parallel",
        "4",
        "-b",
        "2048",
        "-ub",
        "512",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "-ngl",
        "999",
        "--rpc",
        "10.0.0.2:50052",
        "-ot",
        "exps=CPU",
        "-ts",
        "1,1",
        "-t",
        "8",
        "--jinja",
        "--metrics",
        "--api-key-file",
        "/k",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "-a",
        "glm",
        "--no-warmup",
        "-nr",
    ]
    a = perplexity_argv(server, 256, chunks=8)
    assert a == [
        "-m",
        "/m.gguf",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "-fa",
        "on",
        "-ngl",
        "999",
        "--rpc",
        "10.0.0.2:50052",
        "-ot",
        "exps=CPU",
        "-ts",
        "1,1",
        "-t",
        "8",
        "-nr",
        "-c",
        "256",
        "-b",
        "256",
        "-ub",
        "256",
        "--chunks",
        "8",
    ]
    assert perplexity_argv(["-m", "x", "-ub", "64"], 256)[-2:] == ["-ub", "64"]


def test_base_size_matches_a_written_file() -> None:
    # llama-perplexity --kl-divergence-base at -c 256 over 33 chunks of a 259-token vocabulary wrote 2246660 bytes
    assert base_size_bytes(259, 256, 33) == 2246660
