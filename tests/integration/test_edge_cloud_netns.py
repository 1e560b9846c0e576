"""The edge-cloud split across a real network: `streamfuse edge` and `streamfuse cloud` run as
processes in two network namespaces joined by a veth pair, with nftables rules on the path,
not the in-process fault proxy: random loss both ways must be repaired within the deadline,
and UDP dropped outright must make the edge fall back to TCP. Needs root, `ip` and `nft`
(skipped with the reason otherwise)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamfuse.assets import demo_files
from streamfuse.sinks.jsonl import read_jsonl
from streamfuse.testing.media import cut

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PORT = 9000
EDGE_IP, CLOUD_IP = "10.77.0.1", "10.77.0.2"


def _sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


class Namespaces:
    """Two namespaces, `edge` and `cloud`, on one /24 over a veth pair."""

    def __init__(self) -> None:
        tag = f"sf{os.getpid() % 100000}"
        self.edge, self.cloud = f"{tag}e", f"{tag}c"

    def up(self) -> None:
        for ns in (self.edge, self.cloud):
            _sh("ip", "netns", "add", ns)
        a, b = f"{self.edge}v", f"{self.cloud}v"
        _sh("ip", "link", "add", a, "netns", self.edge, "type", "veth", "peer", "name", b)
        _sh("ip", "link", "set", b, "netns", self.cloud)
        for ns, dev, ip in ((self.edge, a, EDGE_IP), (self.cloud, b, CLOUD_IP)):
            _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "sf")
            _sh(
                "ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "sf", "input",
                "{ type filter hook input priority 0; }",
            )  # fmt: skip

    def drop(self, ns: str, rule: str) -> None:
        """Add `rule ... counter drop` to `ns`'s input chain."""
        _sh("ip", "netns", "exec", ns, "nft", "add", "rule", "inet", "sf", "input",
            *rule.split(), "counter", "drop")  # fmt: skip

    def dropped(self, ns: str) -> int:
        """Packets the drop rules of `ns` have dropped."""
        rules = _sh("ip", "netns", "exec", ns, "nft", "list", "chain", "inet", "sf", "input")
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", rules))

    def down(self) -> None:
        for ns in (self.edge, self.cloud):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def netns() -> Iterator[Namespaces]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not (shutil.which("ip") and shutil.which("nft")):
        pytest.skip("needs iproute2 (`ip`) and nftables (`nft`): apt-get install nftables")
    ns = Namespaces()
    try:
        ns.up()
    except subprocess.CalledProcessError as e:
        ns.down()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    try:
        yield ns
    finally:
        ns.down()


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with demo_files() as files:
        return cut(files.clip, tmp_path_factory.mktemp("clip") / "cut.mp4", 12.0)  # 2 slides


def _split(ns: Namespaces, clip: Path, out: Path) -> tuple[dict, dict]:
    """Run the cloud, then the edge, each in its namespace; (edge report, cloud link)."""
    cli = [sys.executable, "-m", "streamfuse.cli"]
    cloud = subprocess.Popen(
        ["ip", "netns", "exec", ns.cloud, *cli, "cloud", "--listen", f"{CLOUD_IP}:{PORT}",
         "--out", str(out), "--idle-timeout-s", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert cloud.stderr is not None
        for line in cloud.stderr:  # wait until it listens (models loaded)
            if "listening" in line:
                break
        else:
            pytest.fail(f"the cloud exited before listening: {cloud.wait()}")
        edge = subprocess.run(
            ["ip", "netns", "exec", ns.edge, *cli, "edge", str(clip), "--to",
             f"{CLOUD_IP}:{PORT}"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert edge.returncode == 0, edge.stderr[-2000:]
        stdout, stderr = cloud.communicate(timeout=120)
    finally:
        cloud.kill()
    assert cloud.returncode == 0, stderr[-2000:]
    return json.loads(edge.stdout.strip().splitlines()[-1]), json.loads(stdout.splitlines()[-1])


def _texts(out: Path, kind: str) -> list[str]:
    return [r["text"] for r in read_jsonl(out).records if r["type"] == kind]


def test_random_loss_on_a_real_path_is_repaired(
    netns: Namespaces, clip: Path, tmp_path: Path
) -> None:
    # 10% of datagrams to the cloud and 10% of its acknowledgements and NACKs lost.
    netns.drop(netns.cloud, f"udp dport {PORT} numgen random mod 100 < 10")
    netns.drop(netns.edge, f"udp sport {PORT} numgen random mod 100 < 10")
    out = tmp_path / "cloud.jsonl"
    report, link = _split(netns, clip, out)

    assert netns.dropped(netns.cloud) > 0 and netns.dropped(netns.edge) > 0
    assert report["link_kind"] == "udp" and report["sender"]["retransmits"] > 0
    assert link["late_dropped"] == 0 and link["undecodable"] == 0
    assert link["video_messages"] == report["key_frames"] == 2
    ocr = _texts(out, "ocr")
    assert len(ocr) == 2 and all(len(t) > 20 for t in ocr)
    assert len(" ".join(_texts(out, "asr")).split()) > 15


def test_udp_blocked_falls_back_to_tcp(netns: Namespaces, clip: Path, tmp_path: Path) -> None:
    netns.drop(netns.cloud, f"udp dport {PORT}")
    out = tmp_path / "cloud.jsonl"
    report, _link = _split(netns, clip, out)

    assert netns.dropped(netns.cloud) > 0  # UDP was tried, and blocked
    assert report["link_kind"] == "tcp"
    assert len(_texts(out, "ocr")) == 2
    assert len(" ".join(_texts(out, "asr")).split()) > 15
