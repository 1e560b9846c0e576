"""The command line speaks the config's vocabulary: `--vision-policy` is `vision.policy.kind`,
`--ocr-budget-s` the dynamic policy's budget, with no second set of defaults."""

from __future__ import annotations

from typing import get_args

import pytest
import typer

from streamfuse.app import StreamfuseConfig
from streamfuse.cli import VisionPolicyChoice, _vision_options
from streamfuse.vision import ArticlePolicy, DynamicPolicy, FixedPolicy, PolicyKind

pytestmark = pytest.mark.unit


def config(**options: object) -> StreamfuseConfig:
    args = {"vision_policy": None, "ocr_budget_s": None, "ocr_precision": None, **options}
    return StreamfuseConfig(vision=_vision_options(**args))  # type: ignore[arg-type]


def test_policy_choices_are_the_config_kinds() -> None:
    assert {c.value for c in VisionPolicyChoice} == set(get_args(PolicyKind))


def test_options_map_onto_the_policy_variant() -> None:
    assert config().vision.policy == DynamicPolicy()  # no options: the config's defaults
    assert isinstance(config(vision_policy="fixed").vision.policy, FixedPolicy)
    assert isinstance(config(vision_policy="article").vision.policy, ArticlePolicy)
    budget = config(ocr_budget_s=0.5).vision.policy
    assert isinstance(budget, DynamicPolicy) and budget.controller.budget_s == 0.5
    assert budget.start_side_px == DynamicPolicy().start_side_px  # nothing else changes
    both = config(vision_policy="dynamic", ocr_budget_s=2.0, ocr_precision="int8").vision
    assert isinstance(both.policy, DynamicPolicy) and both.policy.controller.budget_s == 2.0
    assert both.ocr.precision == "int8"


def test_a_budget_for_a_policy_without_one_is_refused() -> None:
    for kind in ("fixed", "article"):
        with pytest.raises(typer.Exit):
            _vision_options(kind, 0.5, None)
