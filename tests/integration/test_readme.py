"""The README's library example runs as written (on the short test clip, not paced)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Library use") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under '## Library use'"
    code = match.group(1)
    assert '"talk.mp4", realtime=True' in code
    short = ROOT / "assets" / "test" / "short.mp4"
    code = code.replace('"talk.mp4", realtime=True', f'"{short}", realtime=False')
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    printed = capsys.readouterr().out.strip()
    means, tail = printed.split("]", 1)
    values = [float(x) for x in means.strip("[").split(",")]
    assert len(values) == 3 and all(0.0 < v < 255.0 for v in values)
    assert tail.strip().endswith("frames dropped")
