"""Data files shipped inside the package: the demo lecture clip and its ground truth.

Resolved through `importlib.resources`, so they are found the same way in an installed wheel
and in a source checkout (never relative to the repository root).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

DEMO_CLIP_NAME = "lecture.mp4"
DEMO_TRUTH_NAME = "lecture.truth.json"


def demo_dir() -> Traversable:
    """The folder of the bundled demo clip and truth, as an importlib.resources handle."""
    return resources.files(__name__).joinpath("demo")


@dataclass(frozen=True, slots=True)
class DemoFiles:
    clip: Path
    truth: Path


@contextmanager
def demo_files() -> Iterator[DemoFiles]:
    """Real file-system paths of the demo clip and its truth, valid inside the `with` block
    (a zipped install extracts them to temporary files; a normal install needs no copy)."""
    folder = demo_dir()
    with ExitStack() as stack:
        clip = stack.enter_context(resources.as_file(folder.joinpath(DEMO_CLIP_NAME)))
        truth = stack.enter_context(resources.as_file(folder.joinpath(DEMO_TRUTH_NAME)))
        yield DemoFiles(clip=clip, truth=truth)
