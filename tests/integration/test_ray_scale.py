"""Stream branches on a real local Ray cluster of two nodes (two raylets on this machine,
started and stopped by the test): every stream completes with the text of an undisturbed local
run, also when one node is killed mid-run, and no committed event is repeated."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamfuse.app import StreamfuseConfig
from streamfuse.errors import SourceError
from streamfuse.testing.records import SpeechWatch, committed_words, run_local, slide_texts

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from streamfuse.scale import RayConfig, run_on_ray  # noqa: E402

pytestmark = pytest.mark.integration

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


@pytest.fixture()
def cluster() -> Iterator[Any]:
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    nodes.add_node(num_cpus=1)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def test_streams_survive_a_node_killed_mid_run(cluster: Any) -> None:
    config = StreamfuseConfig()
    reference = run_local([str(SHORT)], config)
    collect = SpeechWatch()
    victim = cluster.list_all_nodes()[-1]

    async def kill_after_first_speech() -> None:
        await collect.first_speech.wait()
        cluster.remove_node(victim)

    async def main() -> Any:
        killer = asyncio.create_task(kill_after_first_speech())
        try:
            return await run_on_ray(
                [str(SHORT)] * 4, config, [collect], RayConfig(address=cluster.address)
            )
        finally:
            killer.cancel()

    report = asyncio.run(main())
    assert report.nodes == 2
    assert sum(run.restarts for run in report.streams) >= 1, "no stream was on the killed node"
    assert len({n for run in report.streams for n in run.nodes}) == 2
    want_words, want_slides = committed_words(reference, "short"), slide_texts(reference, "short")
    assert want_words and want_slides
    for run in report.streams:
        assert run.error is None and run.final is not None, run
        assert committed_words(collect.records, run.stream_id) == want_words, run.stream_id
        assert slide_texts(collect.records, run.stream_id) == want_slides, run.stream_id
        # Committed speech never goes back in media time (nothing repeated at the restart).
        ends = [
            w["t_end"]
            for r in collect.records
            if r["type"] == "asr" and r["stream_id"] == run.stream_id
            for w in r["words"]
        ]
        assert ends == sorted(ends)
    ids = [r["id"] for r in collect.records if "id" in r]
    assert len(ids) == len(set(ids))
    final = collect.records[-1]
    assert final["type"] == "stats" and final["final"] is True
    assert any(name.startswith("asr:3:short") for name in final["stages"])


def test_a_bad_input_fails_as_a_local_run_does(cluster: Any, tmp_path: Path) -> None:
    missing = tmp_path / "missing.mp4"
    with pytest.raises(SourceError, match="missing.mp4"):
        asyncio.run(
            run_on_ray([str(missing)], StreamfuseConfig(), [], RayConfig(address=cluster.address))
        )


def test_serve_runs_url_sessions_on_the_cluster(cluster: Any) -> None:
    """`serve --ray`: URL and file sessions run on the cluster's nodes (two at once share the
    nodes' hosts), their results reach the session's subscribers as a local session's do; a
    session stopped mid-run ends with its summary, and a bad input is refused by name."""
    from streamfuse.server import ServeConfig, serve_in_thread
    from streamfuse.server.client import ServeClient

    config = StreamfuseConfig()
    reference = run_local([str(SHORT)], config)
    serve = ServeConfig(
        port=0, token="ray-test-token", ray=RayConfig(address=cluster.address), job=config
    )

    async def scenario(url: str) -> None:
        async with ServeClient(url, serve.token, timeout_s=120.0) as client:
            bad = await client.http.post("/api/sessions", json={"input": "/no/such/clip.mp4"})
            assert bad.status_code == 400 and "input not found: /no/such/clip.mp4" in bad.text
            ids = [(await client.create_session(input=str(SHORT)))["id"] for _ in range(2)]
            got = await asyncio.gather(*(_collect(client, i) for i in ids))
            infos = [await client.session(i) for i in ids]
            for records, info in zip(got, infos, strict=True):
                assert info["status"] == "finished" and info["ray"]["nodes"], info
                assert committed_words(records, "short") == committed_words(reference, "short")
                assert slide_texts(records, "short") == slide_texts(reference, "short")
                assert records[-1]["type"] == "stats" and records[-1]["final"] is True
                ids_seen = [r["id"] for r in records if "id" in r]
                assert len(ids_seen) == len(set(ids_seen))
            # Placed least-loaded first: the two sessions ran on the two nodes.
            assert {info["ray"]["nodes"][0] for info in infos} == {
                n["NodeID"] for n in ray.nodes() if n["Alive"]
            }
            live = await client.create_session(input=str(SHORT), realtime=True)
            async for record in client.events(live["id"]):
                if record["type"] in ("ocr", "asr"):
                    break
            stopped = await client.stop(live["id"])
            assert stopped["status"] == "stopped"
            assert stopped["summary"]["type"] == "stats" and stopped["summary"]["final"] is True

    with serve_in_thread(serve) as url:
        asyncio.run(asyncio.wait_for(scenario(url), 300))


async def _collect(client: Any, session_id: str) -> list[dict[str, Any]]:
    return [r async for r in client.events(session_id)]
