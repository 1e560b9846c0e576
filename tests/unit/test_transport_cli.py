"""`streamfuse edge` / `streamfuse cloud` refuse bad options with a one-line error and exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from streamfuse.cli import app

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["edge", "x.mp4", "--to", "nowhere"], "--to expects HOST:PORT"),
        (["cloud", "--listen", "127.0.0.1:port"], "--listen expects HOST:PORT"),
        (["edge", "x.mp4", "--to", "127.0.0.1:9", "--faults", "loss=2"], "invalid option"),
        (["edge", "missing.mp4", "--to", "127.0.0.1:9"], "missing.mp4"),
        (["edge", "x.mp4", "--to", "127.0.0.1:9", "--link", "pigeon"], "pigeon"),
    ],
)
def test_bad_options_exit_2_with_a_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
