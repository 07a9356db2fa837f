"""The rule generator: finds known identities, emits no trivial or duplicate pair, and every
rule it emits (and every rule it shipped) holds in onnxruntime at its verified shapes."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from rlflow.rewrite import generator
from rlflow.rewrite.generator.dag import ExprDag
from rlflow.rewrite.generator.domain import VERIFY_VALUES
from rlflow.rewrite.generator.pairs import Pair, domain_points
from rlflow.rewrite.generator.symbolic import make_half, make_sum, resolve, unify
from rlflow.rewrite.generator.verification import verify
from rlflow.rewrite.template import GENERATED_PATH as SHIPPED

KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
COMMUTATIVE = {"Add", "Mul"}


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    """A reduced enumeration (rank 2, four op types, three inputs): a few seconds."""
    return generator.generate(
        max_ops=3,
        ops=("MatMul", "Concat", "Relu", "Transpose"),
        num_inputs=3,
        ranks=(2,),
        workers=1,
    )


def side_exprs(side: dict, names: dict[str, str]) -> list[str]:
    """The expression of each output of a rule side, inputs renamed by `names`."""
    values = dict(names)
    for op, inputs, outputs, attrs in side["nodes"]:
        args = [values[name] for name in inputs]
        if op in COMMUTATIVE:
            args.sort()
        tag = op + (f"[{attrs['axis']}]" if "axis" in attrs else "")
        for k, name in enumerate(outputs):
            values[name] = f"{tag}({','.join(args)})" + (f"#{k}" if len(outputs) > 1 else "")
    return [values[name] for name in side["outputs"]]


def canonical(rule: dict) -> tuple:
    """The rule up to renaming of inputs, order of outputs and which side is which."""
    inputs = sorted(rule["inputs"])
    best = None
    for order in itertools.permutations(range(len(inputs))):
        names = {name: f"v{i}" for name, i in zip(inputs, order)}
        outputs = sorted(zip(side_exprs(rule["lhs"], names), side_exprs(rule["rhs"], names)))
        lhs, rhs = tuple(a for a, _ in outputs), tuple(b for _, b in outputs)
        key = tuple(sorted([lhs, rhs]))
        best = key if best is None or key < best else best
    return best


def canonical_text(lhs: list[str], rhs: list[str], inputs: int) -> tuple:
    best = None
    for order in itertools.permutations(range(inputs)):

        def rename(text: str, order=order) -> str:
            return re.sub(r"x(\d)", lambda m: f"v{order[int(m.group(1))]}", text)

        outputs = sorted(zip(map(rename, lhs), map(rename, rhs)))
        key = tuple(sorted([tuple(a for a, _ in outputs), tuple(b for _, b in outputs)]))
        best = key if best is None or key < best else best
    return best


KNOWN = {
    "matmul associativity": (["MatMul(MatMul(x0,x1),x2)"], ["MatMul(x0,MatMul(x1,x2))"], 3),
    "relu commutes with transpose": (["Relu(Transpose(x0))"], ["Transpose(Relu(x0))"], 1),
    "concat of matmuls sharing the left operand": (
        ["Concat[1](MatMul(x0,x1),MatMul(x0,x2))"],
        ["MatMul(x0,Concat[1](x1,x2))"],
        3,
    ),
    "transpose of matmul": (
        ["Transpose(MatMul(x0,x1))"],
        ["MatMul(Transpose(x1),Transpose(x0))"],
        2,
    ),
}


@pytest.mark.parametrize("label", sorted(KNOWN))
def test_finds_known_identities(rules: list[dict], label: str) -> None:
    lhs, rhs, inputs = KNOWN[label]
    assert canonical_text(lhs, rhs, inputs) in {canonical(rule) for rule in rules}


def test_known_identities_have_telling_names(rules: list[dict]) -> None:
    names = {rule["name"] for rule in rules}
    assert "matmul-is-associative" in names
    assert "relu-commutes-with-transpose" in names


def test_no_trivial_or_duplicate_rules(rules: list[dict]) -> None:
    keys = [canonical(rule) for rule in rules]
    assert all(lhs != rhs for lhs, rhs in keys)
    assert len(set(keys)) == len(keys)


def run_side(side: dict, shapes: dict[str, list[int]], feeds: dict[str, np.ndarray]) -> list:
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in side["nodes"]],
        "side",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
            for name, shape in shapes.items()
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in side["outputs"]],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    used = {name for _, ins, _, _ in side["nodes"] for name in ins}
    return session.run(None, {name: feeds[name] for name in shapes if name in used})


def assert_holds(rule: dict) -> None:
    for seed, shapes in enumerate(rule["verified_shapes"]):
        rng = np.random.default_rng(seed)
        feeds = {
            name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()
        }
        left = run_side(rule["lhs"], shapes, feeds)
        right = run_side(rule["rhs"], shapes, feeds)
        for a, b in zip(left, right):
            assert a.shape == b.shape, rule["name"]
            scale = max(1.0, float(np.abs(a).max()))
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * scale, err_msg=rule["name"])


def test_emitted_rules_hold_in_onnxruntime(rules: list[dict]) -> None:
    assert len(rules) >= 10
    for rule in rules:
        assert_holds(rule)


def test_verification_rejects_a_false_rule() -> None:
    """MatMul does not commute: the verifier must say so at some shape."""
    lhs = ExprDag(2, 2, (("MatMul", (0, 1)),), (2,))
    rhs = ExprDag(2, 2, (("MatMul", (1, 0)),), (2,))
    pair = Pair(lhs, rhs)
    points = domain_points(pair, VERIFY_VALUES)
    assert points is not None  # x0, x1 square and of one size: both sides well typed
    assert verify(pair, points) != ""


def test_shape_unification() -> None:
    """Concat makes a sum, Split a half; splitting the sum of equal halves undoes it."""
    a, b = ("v", 0), ("v", 1)
    subst = unify(make_half(make_sum(a, b)), a, {})
    assert subst is not None and resolve(b, subst) == a
    assert unify(a, make_sum(a, b), {}) is None  # a = a + b has no solution


def check_well_formed(document: dict) -> None:
    assert document["version"] == 1
    assert document["generator"].startswith("rlflow.rewrite.generator")
    assert document["opset"] == 18
    names = [rule["name"] for rule in document["rules"]]
    assert len(set(names)) == len(names)
    for rule in document["rules"]:
        assert KEBAB.match(rule["name"]), rule["name"]
        assert rule["origin"] == "generated"
        assert isinstance(rule["bidirectional"], bool)
        inputs = rule["inputs"]
        assert all(re.fullmatch(r"x\d+", name) for name in inputs)
        assert all(spec["rank"] in (2, 4) for spec in inputs.values())
        read = set()
        for side in (rule["lhs"], rule["rhs"]):
            known = set(inputs)
            for op, ins, outs, attrs in side["nodes"]:
                assert isinstance(op, str) and isinstance(attrs, dict)
                assert all(name in known for name in ins), (rule["name"], ins)
                assert all(re.fullmatch(r"[ty]\d+", name) and name not in known for name in outs)
                known.update(outs)
                read.update(name for name in ins if name in inputs)
            assert side["outputs"] == [f"y{k}" for k in range(len(side["outputs"]))]
        assert rule["lhs"]["outputs"] == rule["rhs"]["outputs"]
        assert read == set(inputs), rule["name"]
        assert len(rule["verified_shapes"]) == 3
        for shapes in rule["verified_shapes"]:
            assert set(shapes) == set(inputs)
            assert all(len(shapes[name]) == spec["rank"] for name, spec in inputs.items())


def test_generated_document_is_well_formed(rules: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    generator.write_rules(
        path, max_ops=2, ops=("MatMul", "Relu", "Transpose"), num_inputs=3, ranks=(2,)
    )
    check_well_formed(json.loads(path.read_text()))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".generated-")]


def test_shipped_rules_load_and_are_well_formed() -> None:
    document = json.loads(SHIPPED.read_text())
    check_well_formed(document)
    assert len(document["rules"]) >= 130


def test_shipped_rules_hold_in_onnxruntime() -> None:
    for rule in json.loads(SHIPPED.read_text())["rules"]:
        assert_holds(rule)
