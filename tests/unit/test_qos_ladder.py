"""Resolution ladder: 32-px alignment, ordering, scale mapping."""

from __future__ import annotations

import pytest

from streamfuse.errors import ConfigError
from streamfuse.qos.ladder import DEFAULT_LADDER, Ladder, Rung, align_px

pytestmark = pytest.mark.unit


def test_default_ladder_is_the_conventional_16_9_rungs() -> None:
    assert [str(r) for r in DEFAULT_LADDER] == [
        "1920x1088",
        "1600x896",
        "1280x704",
        "1024x576",
        "960x544",
        "800x448",
        "640x352",
    ]


def test_align_rounds_to_nearest_32_ties_down() -> None:
    assert align_px(1080) == 1088
    assert align_px(720) == 704
    assert align_px(735) == 736
    assert align_px(3) == 32
    assert align_px(752) == 736 and align_px(752, ties="even") == 768  # rapidocr's round()
    assert align_px(720, ties="even") == 704 and align_px(3, ties="even") == 32
    with pytest.raises(ConfigError):
        align_px(0)


def test_derived_ladder_is_aligned_and_strictly_decreasing() -> None:
    ladder = Ladder.from_max(1280, aspect=4 / 3, n_rungs=5, min_width_px=320)
    sides = [r.pixels for r in ladder]
    assert sides == sorted(sides, reverse=True) and len(set(sides)) == len(sides)
    assert all(r.width_px % 32 == 0 and r.height_px % 32 == 0 for r in ladder)
    assert ladder[0] == Rung(1280, 960)


def test_scale_fits_frame_inside_rung_and_never_upscales() -> None:
    rung = DEFAULT_LADDER[2]  # 1280x704
    assert rung.scale_for(1920, 1080) == pytest.approx(704 / 1080)
    assert rung.size_for(1920, 1080) == (1252, 704)
    assert DEFAULT_LADDER[0].scale_for(1280, 720) == 1.0
    assert DEFAULT_LADDER[0].scale_for(1280, 720, allow_upscale=True) > 1.0


def test_nearest_rung_and_bad_ladders() -> None:
    assert DEFAULT_LADDER.nearest(1280, 720) == 2
    assert DEFAULT_LADDER.nearest(1920, 1080) == 0
    with pytest.raises(ConfigError):
        Ladder((Rung(640, 352), Rung(1280, 704)))
    with pytest.raises(ConfigError):
        Ladder((Rung(650, 352),))
