"""The rollout's lean HTTP client against small servers on loopback: JSON round trips over reused
keep-alive connections, a pooled connection the server closed is retried on a fresh one, and failures
are errors that name what happened."""
from __future__ import annotations

import asyncio
import json

import pytest

from miles.rollout.http_client import HttpxPoster, LeanPoster, PostFailed, json_poster
from miles.serving.process import free_port


class EchoServer:
    """Answers every POST with {"path", "length", "routing"} of the request; counts connections. With
    `close_after_answer`, it closes each connection right after answering (with no Connection: close)."""

    def __init__(self, close_after_answer: bool = False):
        self.close_after_answer = close_after_answer
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                body = await reader.readexactly(int(headers["Content-Length"]))
                answer = json.dumps({"path": lines[0].split()[1], "length": len(body),
                                     "routing": headers.get("X-SMG-Routing-Key")}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(handler: EchoServer):
    port = free_port("127.0.0.1")
    server = await asyncio.start_server(handler.handle, "127.0.0.1", port)
    return server, f"http://127.0.0.1:{port}"


def test_posts_reuse_one_keep_alive_connection():
    async def main():
        echo = EchoServer()
        server, url = await serve(echo)
        async with server:
            client = json_poster(url, timeout=30, concurrency=4)
            assert isinstance(client, LeanPoster)
            answers = [await client.post("/generate", {"i": i, "pad": "x" * i}, {"X-SMG-Routing-Key": "k"})
                       for i in range(5)]
            await client.aclose()
        return echo, answers

    echo, answers = asyncio.run(main())
    assert all(status == 200 for status, _ in answers)
    bodies = [json.loads(body) for _, body in answers]
    assert [b["length"] for b in bodies] == [len(json.dumps({"i": i, "pad": "x" * i})) for i in range(5)]
    assert {b["path"] for b in bodies} == {"/generate"} and {b["routing"] for b in bodies} == {"k"}
    assert echo.connections == 1


def test_a_pooled_connection_the_server_closed_is_retried_on_a_new_one():
    async def main():
        echo = EchoServer(close_after_answer=True)
        server, url = await serve(echo)
        async with server:
            client = LeanPoster(url + "/", timeout=30)
            answers = [await client.post("/generate", {"i": i}) for i in range(4)]
            await client.aclose()
        return echo, answers

    echo, answers = asyncio.run(main())
    assert [status for status, _ in answers] == [200] * 4
    assert echo.connections == 4


def test_failures_are_post_failed_and_bad_headers_are_refused():
    async def main():
        client = LeanPoster(f"http://127.0.0.1:{free_port('127.0.0.1')}", timeout=5)  # nobody listens
        with pytest.raises(PostFailed, match="cannot connect"):
            await client.post("/generate", {})
        with pytest.raises(ValueError, match="line break"):
            await client.post("/generate", {}, {"X-SMG-Routing-Key": "a\r\nInjected: yes"})
        await client.aclose()

    asyncio.run(main())


def test_https_urls_keep_httpx():
    async def main():
        client = json_poster("https://example.invalid", timeout=5, concurrency=2)
        assert isinstance(client, HttpxPoster)
        await client.aclose()

    asyncio.run(main())
