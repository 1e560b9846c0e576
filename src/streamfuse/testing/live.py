"""Real servers on loopback for testing live inputs: a static HTTP server with or without Range
support (`HttpServer`), an RTSP server readers pull from (`RtspServer`, Debian's relay), and a
feed pusher in its own process that sends a clip at wall-clock speed to a UDP, RTP or RTSP URL
(`Pusher`; killing it is a dropped feed).

Run a pusher by hand: ``python -m streamfuse.testing.live CLIP URL --format mpegts``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import av

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def ephemeral_low() -> int:
    """The lowest port the kernel hands out itself (`bind(0)`, outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(
    *kinds: socket.SocketKind, host: str = "127.0.0.1", avoid: Collection[int] = ()
) -> int:
    """A port free on `host` right now for every socket kind given (TCP when none;
    `socket.SOCK_DGRAM` for UDP; both for a transport that falls back from one to the other),
    none of `avoid` (ports drawn already for the same server).

    The port is drawn at random from below the kernel's ephemeral range: a port the kernel hands
    out itself (bound to 0, then closed) can be taken again by any outgoing connection (a scrape,
    an HTTP poll) before the server under test binds it, which is how a run started many seconds
    later once failed with "Address already in use". Another process may still bind it first.
    """
    kinds = kinds or (socket.SOCK_STREAM,)
    high = ephemeral_low()
    low = max(1024, high - 12000)
    rng = random.Random()  # its own, seeded from the OS: a test seeding `random` draws alike
    for _ in range(200):
        port = rng.randrange(low, high)
        if port in avoid:
            continue
        try:
            for kind in kinds:
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise OSError(f"no free port on {host} between {low} and {high}")


class _Handler(SimpleHTTPRequestHandler):
    """Static files; single byte ranges when the server allows them (without, it answers as
    the standard library's handler: whole files, no `Accept-Ranges`)."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        self.server.requests.append(self.requestline)

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            super().do_GET()  # listings, 404s
            return
        size = path.stat().st_size
        first, last = 0, size - 1
        header = self.headers.get("Range") if self.server.ranges else None
        match = _RANGE.match(header.strip()) if header else None
        if match is not None:
            first = int(match[1]) if match[1] else max(0, size - int(match[2] or 0))
            last = min(size - 1, int(match[2])) if match[1] and match[2] else size - 1
            if first >= size:
                self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                return
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        else:
            self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Length", str(last - first + 1))
        if self.server.ranges:
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        budget = self.server.take_drop()
        with path.open("rb") as f:
            f.seek(first)
            remaining = last - first + 1
            try:
                while remaining > 0:
                    chunk = f.read(min(remaining, 64 * 1024, budget or remaining))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    remaining -= len(chunk)
                    if budget is not None:
                        budget -= len(chunk)
                        if budget <= 0:  # the connection breaks mid-body
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            self.close_connection = True
                            return
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client closed the connection (it seeks by reconnecting)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ranges = True
    requests: list[str]
    drop_after_bytes: int | None = None

    def take_drop(self) -> int | None:
        """Bytes the next response may send before its connection breaks (once)."""
        budget, self.drop_after_bytes = self.drop_after_bytes, None
        return budget


class HttpServer:
    """Serves the files under `root` on loopback from a thread; `ranges=False` behaves as
    `python -m http.server` (whole files only, no seeking). `drop_after_bytes`: the first
    response breaks off after that many bytes of its body, as a connection lost mid-download."""

    def __init__(
        self, root: str | Path, *, ranges: bool = True, drop_after_bytes: int | None = None
    ) -> None:
        root = str(root)

        class Handler(_Handler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=root, **kwargs)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.ranges = ranges
        self._server.requests = []
        self._server.drop_after_bytes = drop_after_bytes
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def requests(self) -> list[str]:
        """The request lines served so far."""
        return list(self._server.requests)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> HttpServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


class RtspServer:
    """Debian's `rtsp-server-perl` (a relay: a sender ANNOUNCEs and RECORDs a stream at
    `publish_url`, readers PLAY it at `url`) on loopback ports, in its own process. RTP goes
    over UDP (the relay speaks no interleaved TCP). Raises `FileNotFoundError` when the program
    is not installed (`apt-get install rtsp-server-perl`)."""

    PROGRAM = "rtsp-server-perl"

    def __init__(self) -> None:
        import shutil

        program = shutil.which(self.PROGRAM)
        if program is None:
            raise FileNotFoundError(
                f"{self.PROGRAM} not installed (apt-get install {self.PROGRAM})"
            )
        self.client_port = free_port()
        self.source_port = free_port(avoid={self.client_port})
        rtp = free_port(socket.SOCK_DGRAM, avoid={self.client_port, self.source_port})
        cmd = [program, "--clientport", str(self.client_port), "--serverport"]
        cmd += [str(self.source_port), "--client_listen_address", "127.0.0.1"]
        cmd += ["--source_listen_address", "127.0.0.1", "--rtp_start_port", str(rtp)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10.0
        while not _accepts(self.source_port) or not _accepts(self.client_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{self.PROGRAM} did not start (exit {self.proc.returncode})")
            time.sleep(0.05)

    def publish_url(self, path: str = "live") -> str:
        """Where a sender pushes (`Pusher(..., format="rtsp", options={"rtsp_transport":
        "udp"})`)."""
        return f"rtsp://127.0.0.1:{self.source_port}/{path}"

    def url(self, path: str = "live") -> str:
        """Where a reader plays the stream."""
        return f"rtsp://127.0.0.1:{self.client_port}/{path}"

    def wait_published(self, path: str = "live", timeout_s: float = 20.0) -> None:
        """Until a sender has announced `path` (a reader's DESCRIBE gets 200, not 404) and
        started recording it. The relay mounts `path` at the sender's ANNOUNCE but adds each
        stream only at that stream's SETUP: a reader joining in between gets 404 for the streams
        not set up yet. At RECORD the relay binds an RTP and an RTCP port per stream, so the
        stream is whole once the relay holds two UDP sockets per stream of the description."""
        import psutil

        deadline = time.monotonic() + timeout_s
        request = f"DESCRIBE {self.url(path)} RTSP/1.0\r\nCSeq: 1\r\n\r\n".encode()
        streams = 0
        while time.monotonic() < deadline:
            if not streams:
                with socket.create_connection(("127.0.0.1", self.client_port), 2.0) as conn:
                    conn.sendall(request)
                    reply = _rtsp_reply(conn)
                if b" 200 " in reply.split(b"\r\n", 1)[0]:
                    streams = reply.count(b"\nm=")
            if streams and len(psutil.Process(self.proc.pid).net_connections("udp")) >= 2 * streams:
                return
            time.sleep(0.05)
        raise TimeoutError(f"nothing published at {self.url(path)} within {timeout_s} s")

    def wait_reader(self, timeout_s: float = 120.0) -> None:
        """Until a reader holds a connection to the server's client port (after a
        `wait_published`, whose own connection is closed by then)."""
        import psutil

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_ESTABLISHED and conn.laddr.port == self.client_port:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"no reader joined {self.url()} within {timeout_s} s")

    def release_on_join(self, pusher: Pusher, settle_s: float = 0.5) -> threading.Thread:
        """Start a held sender (`Pusher(..., hold=True)`) from a thread once a reader has
        connected and had `settle_s` to PLAY: the reader gets the stream from its first
        packet. The sender is released after `wait_reader`'s timeout too."""

        def release() -> None:
            try:
                self.wait_reader()
                time.sleep(settle_s)
            finally:
                pusher.release()

        thread = threading.Thread(target=release, name="rtsp-release", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def __enter__(self) -> RtspServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def wait_udp_listener(port: int, timeout_s: float = 60.0) -> None:
    """Until a process has a UDP socket bound to `port` (a reader opened `udp://...:port`):
    datagrams sent before that are lost, and a feed joined after its key frame shows no video
    until the next one."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(c.laddr and c.laddr.port == port for c in psutil.net_connections(kind="udp")):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on UDP port {port} within {timeout_s} s")


def _rtsp_reply(conn: socket.socket) -> bytes:
    """One RTSP reply, its head and the body its Content-Length announces."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Pusher:
    """A process that sends `clip` to `url` (muxer `format`) at wall-clock speed, from
    `start_s` into the clip, after `delay_s`. At clip time `stop_s` the process dies (no
    goodbye, no trailer), as a crashed sender; `kill` does the same at any moment. With `hold`
    it opens the output (an RTSP sender ANNOUNCEs and RECORDs) and waits for `release` before
    the first packet, so readers can join a relay before the stream starts."""

    def __init__(
        self,
        clip: str | Path,
        url: str,
        *,
        format: str,  # noqa: A002 - FFmpeg's name for it
        start_s: float = 0.0,
        stop_s: float | None = None,
        options: dict[str, str] | None = None,
        delay_s: float = 0.0,
        hold: bool = False,
    ) -> None:
        cmd = [sys.executable, "-m", "streamfuse.testing.live", str(clip), url, "--format", format]
        cmd += ["--start", str(start_s), "--delay", str(delay_s)]
        if stop_s is not None:
            cmd += ["--die-at", str(stop_s)]
        if hold:
            cmd.append("--hold")
        for key, value in (options or {}).items():
            cmd += ["-o", f"{key}={value}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        stdin = subprocess.PIPE if hold else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=env, stdin=stdin, stderr=subprocess.PIPE)

    def release(self) -> None:
        """Let a held sender start sending."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def __enter__(self) -> Pusher:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()
        for pipe in (self.proc.stdin, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def push(
    clip: str | Path,
    url: str,
    *,
    format: str,  # noqa: A002
    start_s: float = 0.0,
    options: dict[str, str] | None = None,
    die_at_s: float | None = None,
    hold: Callable[[], object] | None = None,
) -> None:
    """Send `clip`'s packets (no re-encode) to `url` at wall-clock speed, from the last key
    frame at or before `start_s`. At clip time `die_at_s` the whole process exits at once.
    `hold`, when given, is called after the output is opened and before the first packet."""
    with av.open(str(clip)) as inp, av.open(url, "w", format=format, options=options or {}) as out:
        mapping = {s.index: out.add_stream_from_template(s) for s in inp.streams}
        if hold is not None:
            out.start_encoding()  # the header: an RTSP sender's ANNOUNCE, SETUP and RECORD
            hold()
        if start_s > 0:
            inp.seek(int(start_s * av.time_base))
        t0_wall: float | None = None
        t0_media = 0.0
        for packet in inp.demux():
            if packet.dts is None:
                continue
            t = float(packet.dts * packet.time_base)
            if die_at_s is not None and t >= die_at_s:
                os._exit(0)  # a crashed sender: nothing more, not even the muxer's goodbye
            if t0_wall is None:
                t0_wall, t0_media = time.monotonic(), t
            due = t0_wall + (t - t0_media)
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            packet.stream = mapping[packet.stream.index]
            out.mux(packet)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send a clip to a URL at wall-clock speed.")
    parser.add_argument("clip")
    parser.add_argument("url")
    parser.add_argument("--format", required=True, help="FFmpeg muxer: mpegts, rtsp, rtp_mpegts")
    parser.add_argument("--start", type=float, default=0.0, help="start this far into the clip")
    parser.add_argument("--delay", type=float, default=0.0, help="wait this long first")
    parser.add_argument("--die-at", type=float, help="exit at once at this clip time")
    parser.add_argument("-o", action="append", default=[], help="muxer option key=value")
    parser.add_argument(
        "--hold", action="store_true", help="open the output, then wait for stdin to close"
    )
    args = parser.parse_args(argv)
    time.sleep(args.delay)
    options = dict(o.split("=", 1) for o in args.o)
    push(
        args.clip,
        args.url,
        format=args.format,
        start_s=args.start,
        options=options,
        die_at_s=args.die_at,
        hold=sys.stdin.read if args.hold else None,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["HttpServer", "Pusher", "RtspServer", "free_port", "push", "wait_udp_listener"]
