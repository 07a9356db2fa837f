"""scripts/probe_rule_sites.py on a small model: one row per site of the rule, both cost
changes, the site a controller takes marked where the per-op change is largest and the
analytic choice where the analytic one is."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_rule_sites.py"


def test_every_site_priced_and_the_controllers_site_marked():
    command = [sys.executable, str(SCRIPT), "resnet-18", "--size", "small", "--start", "ort:all"]
    command += ["--rule", "nchwc-conv-unblock", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    sites = report["sites"]
    assert report["rule"] == "nchwc-conv-unblock" and len(sites) > 1
    assert len({tuple(site["site"]) for site in sites}) == len(sites)
    # Finite, not bounded: on the small model operators take microseconds, a rewrite can
    # double a near-zero net cost.
    assert all(site["node"] and math.isfinite(site["perop_pct"]) for site in sites)
    for mark, key in (("controller_takes", "perop_pct"), ("analytic_takes", "analytic_pct")):
        taken = [site for site in sites if site.get(mark)]
        assert len(taken) == 1
        assert taken[0][key] == max(site[key] for site in sites)


def test_max_candidates_marks_the_offered_sites_and_the_controller_chooses_among_them():
    command = [sys.executable, str(SCRIPT), "resnet-18", "--size", "small", "--start", "ort:all"]
    command += ["--rule", "nchwc-conv-unblock", "--max-candidates", "12", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    sites, offered = report["sites"], [site for site in report["sites"] if site["offered"]]
    assert report["candidates"] > 12 == report["max_candidates"]
    assert 0 < len(offered) < len(sites)
    # Spread over the graph: the rule's offered sites are not just its first ones.
    assert not all(site["offered"] for site in sites[: len(offered)])
    taken = [site for site in sites if site.get("controller_takes")]
    assert len(taken) == 1 and taken[0]["offered"]
    assert taken[0]["perop_pct"] == max(site["perop_pct"] for site in offered)


def test_max_candidates_below_one_is_a_one_line_error():
    command = [sys.executable, str(SCRIPT), "resnet-18", "--rule", "nchwc-conv-unblock"]
    result = subprocess.run(command + ["--max-candidates", "0"], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("--max-candidates must be at least 1")
