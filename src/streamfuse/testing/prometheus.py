"""A real Prometheus server for tests: `PrometheusServer` starts the `prometheus` binary (Debian's
package) on a free loopback port with a generated config scraping the given targets, waits until
it is ready, and queries its HTTP API; `close` kills it. None of this mocks Prometheus.

    with PrometheusServer(["127.0.0.1:9464"], tmp_path) as prom:
        prom.wait_until_up()                        # every target scraped successfully
        prom.wait_for(lambda p: p.query("streamfuse_stage_frames_total"))
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from streamfuse.errors import StreamfuseError
from streamfuse.testing.live import free_port


class PrometheusError(StreamfuseError):
    """The Prometheus binary is missing, did not start, or its API answered an error."""


def find_prometheus() -> str | None:
    """The `prometheus` binary: $PROMETHEUS_BIN, else on PATH, else Debian's /usr/bin path."""
    for candidate in (os.environ.get("PROMETHEUS_BIN"), shutil.which("prometheus")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


class PrometheusServer:
    """One Prometheus process scraping `targets` ("host:port") every `scrape_interval_s`.

    `workdir` holds its config and TSDB. `metrics_path` and `bearer_token` apply to every
    target (an authenticated `/metrics`). `timeout_s` bounds start-up and every API call.
    """

    def __init__(
        self,
        targets: Sequence[str],
        workdir: str | Path,
        *,
        scrape_interval_s: float = 1.0,
        metrics_path: str = "/metrics",
        bearer_token: str | None = None,
        job: str = "streamfuse",
        binary: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if not targets:
            raise PrometheusError("PrometheusServer needs at least one scrape target")
        self.targets = list(targets)
        self.workdir = Path(workdir)
        self.scrape_interval_s = scrape_interval_s
        self.metrics_path = metrics_path
        self.bearer_token = bearer_token
        self.job = job
        self.binary = binary or find_prometheus()
        self.timeout_s = timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.workdir / "prometheus.log"

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The prometheus.yml written (JSON is YAML)."""
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        scrape: dict[str, Any] = {
            "job_name": self.job,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": self.metrics_path,
            "static_configs": [{"targets": self.targets}],
        }
        if self.bearer_token is not None:
            scrape["authorization"] = {"type": "Bearer", "credentials": self.bearer_token}
        return {"global": {"scrape_interval": interval}, "scrape_configs": [scrape]}

    def start(self) -> Self:
        if self.binary is None:
            raise PrometheusError(
                "the prometheus binary was not found (apt-get install prometheus, or set "
                "PROMETHEUS_BIN)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config(), indent=2))
        self.port = free_port()
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with status {self._proc.returncode}: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise PrometheusError(f"prometheus not ready after {self.timeout_s} s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP API -------------------------------------------------------------------------------
    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/`path` with `params`; the `data` of a successful answer."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        except (urllib.error.URLError, OSError) as e:
            raise PrometheusError(f"prometheus API {path} unreachable: {e}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"prometheus API {path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {label: value}, "value": float}] (vector results)."""
        data = self.api("query", query=promql)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": float(data["result"][1])}]
        return [
            {"metric": r["metric"], "value": float(r["value"][1])}
            for r in data["result"]
            if "value" in r
        ]

    def series(self, match: str) -> list[dict[str, str]]:
        """The label sets of every series matching the selector `match` (all stored time)."""
        return list(self.api("series", **{"match[]": match}))

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def wait_for(
        self, predicate: Callable[[PrometheusServer], Any], timeout_s: float | None = None
    ) -> Any:
        """Poll `predicate(self)` until it is truthy (returned) or `timeout_s` passes (None)."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            result = predicate(self)
            if result or time.monotonic() >= deadline:
                return result or None
            time.sleep(min(0.25, self.scrape_interval_s / 2))

    def wait_until_up(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait until every target has been scraped successfully (health `up`)."""

        def all_up(p: PrometheusServer) -> list[dict[str, Any]]:
            targets = p.active_targets()
            ok = len(targets) == len(self.targets) and all(t["health"] == "up" for t in targets)
            return targets if ok else []

        targets = self.wait_for(all_up, timeout_s)
        if not targets:
            states = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.active_targets()]
            raise PrometheusError(f"targets not up after the timeout: {states}")
        return list(targets)


__all__ = ["PrometheusError", "PrometheusServer", "find_prometheus", "free_port"]
