"""Streams on a Ray cluster: 1 node vs 2 nodes, and 2 nodes with one killed mid-run.

Starts real local clusters (raylets on this machine, `ray.cluster_utils.Cluster`), runs N copies
of a clip through `streamfuse.scale.run_on_ray` as fast as they go (no --realtime), and
reports throughput (media seconds per wall second), the 2-node / 1-node ratio, the memory of
each node's host process with the models shared by the node's streams (the default) vs loaded
per stream (`RayConfig(share_models=False)`, the baseline, on 1 node), and for the killed
run: restarts, whether every stream's committed words and slide texts equal an undisturbed
local run's, and duplicate or backwards events. Both node layouts get the same CPUs
in total; on one machine a second node adds no cores, so the ratio measures the overhead of
spreading, not a speed-up (on two machines it is the scale-out). Ends with one JSON line.

    python benchmarks/ray_scale.py [--streams 8] [--clip assets/test/short.mp4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from streamfuse.app import StreamfuseConfig
from streamfuse.scale import RayConfig, RayReport, run_on_ray
from streamfuse.testing.machine import cpu_description
from streamfuse.testing.records import SpeechWatch, committed_words, run_local, slide_texts

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CLIP = ROOT / "assets" / "test" / "short.mp4"


def _cluster(nodes: int) -> Cluster:
    """`nodes` raylets sharing this machine's cores."""
    cores = os.cpu_count() or 2
    share = max(1, cores // nodes)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": share, "include_dashboard": False}
    )
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=share)
    return cluster


def run(
    nodes: int,
    clip: Path,
    streams: int,
    config: StreamfuseConfig,
    *,
    kill: bool,
    share_models: bool = True,
) -> tuple[RayReport, list[dict[str, Any]], float | None]:
    cluster = _cluster(nodes)
    collect = SpeechWatch()
    killed_at: list[float] = []

    async def kill_after_first_speech(t0: float) -> None:
        await collect.first_speech.wait()
        cluster.remove_node(cluster.list_all_nodes()[-1])
        killed_at.append(time.monotonic() - t0)

    async def main() -> RayReport:
        killer = asyncio.create_task(kill_after_first_speech(time.monotonic())) if kill else None
        try:
            return await run_on_ray(
                [str(clip)] * streams,
                config,
                [collect],
                RayConfig(address=cluster.address, share_models=share_models),
            )
        finally:
            if killer is not None:
                killer.cancel()

    try:
        report = asyncio.run(main())
    finally:
        ray.shutdown()
        cluster.shutdown()
    return report, collect.records, killed_at[0] if killed_at else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    print(f"cpu: {cpu_description()}", file=sys.stderr)
    config = StreamfuseConfig()
    reference = run_local([str(args.clip)], config)
    stem = args.clip.stem
    want_words, want_slides = committed_words(reference, stem), slide_texts(reference, stem)
    rows: dict[str, dict[str, Any]] = {}
    for name, nodes, kill, share in (
        ("1 node, per-stream", 1, False, False),
        ("1 node", 1, False, True),
        ("2 nodes", 2, False, True),
        ("2 nodes, kill", 2, True, True),
    ):
        report, records, killed_at = run(
            nodes, args.clip, args.streams, config, kill=kill, share_models=share
        )
        media = sum(r.duration_s or 0.0 for r in report.streams)
        ids = [r["id"] for r in records if "id" in r]
        rows[name] = {
            "nodes": report.nodes,
            "wall_s": round(report.wall_s, 2),
            "throughput": round(media / report.wall_s, 3),
            "killed_at_s": None if killed_at is None else round(killed_at, 2),
            "restarts": sum(r.restarts for r in report.streams),
            "replayed_skipped": sum(r.skipped for r in report.streams),
            "completed": sum(r.final is not None and r.error is None for r in report.streams),
            "text_equal": sum(
                committed_words(records, r.stream_id) == want_words
                and slide_texts(records, r.stream_id) == want_slides
                for r in report.streams
            ),
            "duplicate_ids": len(ids) - len(set(ids)),
            # Per node (its host actor's process): peak resident MiB and the models it loaded.
            "host_peak_rss_mib": sorted(h["peak_rss_mib"] for h in report.hosts.values()),
            "host_models_loaded": [h["models_loaded"] for h in report.hosts.values()],
        }
        print(name, json.dumps(rows[name]), file=sys.stderr)
    print(
        f"{'run':20} {'wall s':>7} {'media s/s':>9} {'restarts':>8} {'complete':>8} "
        f"{'text =':>7}  host peak RSS MiB per node"
    )
    for name, row in rows.items():
        print(
            f"{name:20} {row['wall_s']:7.1f} {row['throughput']:9.2f} {row['restarts']:8d} "
            f"{row['completed']:5d}/{args.streams:<2d} {row['text_equal']:4d}/{args.streams}  "
            f"{row['host_peak_rss_mib']}"
        )
    ratio = rows["2 nodes"]["throughput"] / rows["1 node"]["throughput"]
    print(f"2 nodes / 1 node throughput: {ratio:.2f}x (same cores in total)")
    base, shared = rows["1 node, per-stream"], rows["1 node"]
    mem_ratio = shared["host_peak_rss_mib"][0] / base["host_peak_rss_mib"][0]
    print(
        f"1 node, {args.streams} streams: host peak RSS {base['host_peak_rss_mib'][0]:.0f} MiB "
        f"with models per stream, {shared['host_peak_rss_mib'][0]:.0f} MiB shared "
        f"({mem_ratio:.2f}x); throughput shared / per-stream "
        f"{shared['throughput'] / base['throughput']:.2f}x"
    )
    killed = rows["2 nodes, kill"]
    print(
        json.dumps(
            {
                "streams": args.streams,
                "throughput_1node": rows["1 node"]["throughput"],
                "throughput_2nodes": rows["2 nodes"]["throughput"],
                "throughput_ratio_2v1": round(ratio, 3),
                "kill_restarts": killed["restarts"],
                "kill_completed": killed["completed"],
                "kill_text_equal": killed["text_equal"],
                "duplicate_ids": killed["duplicate_ids"],
                "host_peak_rss_mib_per_stream_models": base["host_peak_rss_mib"][0],
                "host_peak_rss_mib_shared_models": shared["host_peak_rss_mib"][0],
                "host_peak_rss_mib_2nodes": rows["2 nodes"]["host_peak_rss_mib"],
                "models_loaded_per_node": shared["host_models_loaded"],
                "throughput_per_stream_models": base["throughput"],
            }
        )
    )
    return 0 if killed["completed"] == killed["text_equal"] == args.streams else 1


if __name__ == "__main__":
    raise SystemExit(main())
