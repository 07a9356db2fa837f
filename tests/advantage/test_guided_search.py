"""`--method guided:RUN_DIR`: the search expands candidates in the order the trained guide
predicts, is reproducible under a seed, costs one graph per expansion, and goes through
`rlflow optimize`, `rlflow search` and `rlflow bench` like the other methods."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlflow.advantage.guide import load_guide
from rlflow.advantage.spec import run_digest
from rlflow.cost import AnalyticCostModel, OrtSettings
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search import SearchCost, make_cost, search
from rlflow.zoo import cached_path
from tests.advantage.conftest import run_cli
from tests.search.conftest import CostRunner

UNSEEN = "squeezenet-1.1"  # the tiny run was trained on resnet-18 only
QUICK = ("--budget", "3", "--min-time", "0.05")


@pytest.fixture(scope="module")
def unseen_graph():
    return load_model(cached_path(UNSEEN, "small"))


def test_guided_search_is_reproducible_under_a_seed(advantage_run, unseen_graph):
    guide = load_guide(advantage_run[0])
    ruleset = default_ruleset()

    def run(seed: int):
        return search(
            "guided",
            RewriteSession(unseen_graph, ruleset),
            make_cost("analytic"),
            runner=CostRunner(),
            advantage=guide,
            budget=10,
            exploration=0.3,
            seed=seed,
        )

    first, again = run(5), run(5)
    assert first.actions == again.actions
    assert first.finalists == again.finalists
    assert (first.expansions, first.evaluated) == (again.expansions, again.evaluated)
    assert 1 <= first.expansions <= 10
    assert first.evaluated <= first.expansions + 1  # one graph costed per expansion
    assert first.cost <= first.original_cost
    replayed = RewriteSession.replay(unseen_graph, first.state, ruleset)
    assert replayed.graph.canonical_hash() == first.graph.canonical_hash()


def test_without_exploration_the_best_predicted_candidate_goes_first(advantage_run, unseen_graph):
    guide = load_guide(advantage_run[0])
    ruleset = default_ruleset()
    candidates = RewriteSession(unseen_graph, ruleset).candidates()
    best = candidates[int(np.argmin(guide(unseen_graph, candidates)))]
    analytic = AnalyticCostModel()
    costed: list[str] = []

    def cost_ms(graph):
        costed.append(graph.canonical_hash())
        return analytic.cost_ms(graph)

    cost = SearchCost("analytic", cost_ms, OrtSettings().resolved())
    result = search(
        "guided",
        RewriteSession(unseen_graph, ruleset),
        cost,
        runner=CostRunner(),
        advantage=guide,
        budget=1,
        exploration=0.0,
    )
    assert result.expansions == 1 and result.evaluated == 2
    assert costed == [unseen_graph.canonical_hash(), best.graph_hash]


def test_bad_exploration_is_refused(advantage_run, unseen_graph):
    session = RewriteSession(unseen_graph)
    with pytest.raises(RlflowError, match="exploration"):
        search(
            "guided", session, make_cost(), advantage=load_guide(advantage_run[0]), exploration=2
        )


def test_guided_goes_through_optimize_and_search(advantage_run, tmp_path):
    run = advantage_run[0]
    out = tmp_path / "out.onnx"
    argv = ["optimize", "resnet-18", "--method", f"guided:{run}", *QUICK, "--deploy", "online"]
    code, stdout, stderr = run_cli([*argv, "--no-peer", "-o", str(out), "--json"])
    assert code == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["method"] == f"guided:{run}" and summary["equivalent"] is True
    assert 1 <= summary["expansions"] <= 3 and summary["evaluated"] <= summary["expansions"] + 1
    assert summary["seed"] == 0 and summary["exploration"] == 0.1 and summary["alpha"] == 1.05
    assert out.is_file()

    out = tmp_path / "searched.onnx"
    argv = ["search", "resnet-18", "--method", f"guided:{run}", *QUICK, "--deploy", "online"]
    code, stdout, stderr = run_cli([*argv, "--exploration", "0", "-o", str(out), "--json"])
    assert code == 0, stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1])["exploration"] == 0.0


def test_guided_goes_through_bench(advantage_run, tmp_path):
    run = advantage_run[0]
    out = tmp_path / "report"
    code, stdout, stderr = run_cli(
        [
            "bench", "--models", "resnet-18", "--methods", "random", f"guided:{run}", *QUICK,
            "--deploys", "online", "--no-peer", "--out", str(out), "--json",
        ]
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    rows = json.loads(stdout.strip().splitlines()[-1])["rows"]
    guided = next(row for row in rows if row["method"] == f"guided:{run.name}")
    assert guided["equivalent"] and 1 <= guided["expansions"] <= 3
    assert guided["guide_digest"] == run_digest(run)  # a cell is redone once the run retrains
    assert (out / "report.md").is_file()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("guided", "expected guided:RUN_DIR"),
        ("guided:{tmp}/none", "no such advantage run"),
        ("guided:{tmp}", "has no config.yaml"),
    ],
)
def test_a_bad_guided_method_is_one_line(spec, message, tmp_path):
    argv = ["search", "resnet-18", "--method", spec.format(tmp=tmp_path), "-o", str(tmp_path / "o")]
    code, _, stderr = run_cli(argv)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and message in stderr
    assert not (tmp_path / "o").exists()
