"""The import graph keeps the architecture: contracts in `.importlinter` (model-free core, the
pipeline knows no inputs or outputs, no cycle between sibling packages)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _lint_imports(config: Path) -> subprocess.CompletedProcess[str]:
    # import-linter's own command line: it builds the graph from the importable package.
    lint_imports = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint_imports), "--config", str(config), "--no-cache", "--no-logo"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_import_contracts_hold() -> None:
    result = _lint_imports(ROOT / ".importlinter")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_forbidden_import_breaks_the_contract(tmp_path: Path) -> None:
    # The contracts are live: forbidding an import that exists today must fail the check.
    config = tmp_path / "contracts.ini"
    config.write_text(
        "[importlinter]\nroot_package = streamfuse\n\n"
        "[importlinter:contract:x]\nname = app must not import pipeline\ntype = forbidden\n"
        "source_modules =\n    streamfuse.app\nforbidden_modules =\n    streamfuse.pipeline\n"
    )
    result = _lint_imports(config)
    assert result.returncode != 0
    assert "streamfuse.app is not allowed to import streamfuse.pipeline" in result.stdout
