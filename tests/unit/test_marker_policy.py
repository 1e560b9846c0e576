"""The suite-marker rule of tests/conftest.py, run on throwaway test modules."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit

CONFTEST = "from marker_policy import pytest_make_collect_report  # noqa: F401\n"
INI = "[pytest]\nmarkers =\n    unit: u\n    integration: i\n    slow: s\n"


def test_an_unmarked_module_is_a_collection_error_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_marked="import pytest\npytestmark = pytest.mark.unit\ndef test_a():\n    pass\n",
        test_bare="def test_b():\n    pass\n",
    )
    result = pytester.runpytest("--continue-on-collection-errors")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_bare.py: no suite marker*"])


def test_module_level_marks_in_a_list_or_with_others_count(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(
        test_list=(
            "import pytest\n"
            "pytestmark = [pytest.mark.skipif(False, reason='x'), pytest.mark.slow]\n"
            "def test_a():\n    pass\n"
        ),
        test_function_only=(
            "import pytest\n@pytest.mark.unit\ndef test_b():\n    pass\n"  # not module level
        ),
    )
    result = pytester.runpytest("--continue-on-collection-errors")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_function_only.py: no suite marker*"])
