"""The shipped Prometheus alert rules: valid, behaving as their unit tests say, and
written against metric names thaw exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from control_plane.metrics import Metrics

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "thaw-alerts.yml"
RULE_TESTS = RULES_DIR / "thaw-alerts.test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is missing: install Debian's prometheus package (make system-deps)",
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120
    )


@needs_promtool
def test_rules_pass_promtool_check() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 11 rules found" in result.stdout


@needs_promtool
def test_rules_pass_their_unit_tests() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _exported_families() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        kind_suffixes = {
            "histogram": ("_bucket", "_count", "_sum"),
            "counter": ("_total",),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in kind_suffixes)
        names.add(family.name)
    return names


def test_rules_use_only_metrics_thaw_exports() -> None:
    # Recording rules (level:metric:operation) are defined in the file itself.
    text = re.sub(r"\b\w+:\w+:\w+\b", "", RULES.read_text())
    used = set(re.findall(r"\b(thaw_[a-z_]+)\b", text))
    exported = _exported_families()
    assert used, "no thaw metric found in the rules"
    assert used <= exported, f"not exported by control_plane/metrics.py: {used - exported}"
