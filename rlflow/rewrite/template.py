"""Generated rules: `TemplateRule` matches a template's lhs DAG and instantiates its rhs.

The generator (`rlflow/rewrite/generator/`) writes `rules/generated.json`:

    {"version": 1, "generator": "...", "rules": [
      {"name": "matmul-matmul-reassociate", "origin": "generated",
       "inputs": {"x0": {"rank": 2}, "x1": {"rank": 2, "const": true}},
       "lhs": {"nodes": [["MatMul", ["x0", "x1"], ["t0"], {}], ...], "outputs": ["y0"]},
       "rhs": {...}, "bidirectional": true,
       "verified_shapes": [{"x0": [2, 3], "x1": [3, 4]}, ...]}]}

Nodes are [op_type, inputs, outputs, attrs]; `x*` are variables bound to any value of the
given rank (`const`: an initializer), `t*` internal values, `y*` the outputs in order. A
bidirectional rule gives `<name>` and `<name>-reverse`. The rhs's shapes are inferred at
every site; a site where that fails is not one (shape validity is checked in the applier).
`verified_shapes` (per setting, a dict or a list in `inputs` order) are the verifier's shape
settings; without them, small shapes where both sides type are searched for.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from rlflow.errors import RlflowError
from rlflow.graph import Graph, Node, Value, fresh_name
from rlflow.graph.domains import STANDARD_DOMAINS
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.pattern import Pattern, PatternNode, Var
from rlflow.rewrite.replacement import Match, Replacement, RewriteRejected, prepare_replacement
from rlflow.rewrite.rule import GraphIndex, Rule, pattern_anchors

GENERATED_PATH = Path(__file__).parent / "rules" / "generated.json"
TEMPLATE_OPSET = 18  # the generator's Split uses num_outputs (opset 18)
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Relu", "Abs", "Identity"})
_DTYPES = {
    "float": onnx.TensorProto.FLOAT,
    "float32": onnx.TensorProto.FLOAT,
    "double": onnx.TensorProto.DOUBLE,
    "int64": onnx.TensorProto.INT64,
}


def _op(op_type: str) -> tuple[str, str]:
    domain, _, op = op_type.rpartition(".")
    return domain, op


def _pattern_nodes(side: Mapping[str, Any]) -> tuple[PatternNode, ...]:
    nodes = []
    for op_type, inputs, outputs, attrs in side["nodes"]:
        domain, op = _op(op_type)
        nodes.append(PatternNode(op, tuple(inputs), tuple(outputs), domain, dict(attrs)))
    return tuple(nodes)


def _counts(side: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op_type, *_ in side["nodes"]:
        op = _op(op_type)[1]
        counts[op] = counts.get(op, 0) + 1
    return counts


def _variables(side: Mapping[str, Any]) -> set[str]:
    produced = {out for _, _, outputs, _ in side["nodes"] for out in outputs}
    return {v for _, inputs, _, _ in side["nodes"] for v in inputs if v and v not in produced}


class TemplateRule(Rule):
    """One direction of a generated rule."""

    distinct_sites = False  # another operand order of a commutative op may rewrite differently

    def __init__(self, spec: Mapping[str, Any], reverse: bool = False) -> None:
        self.spec = spec
        self.reverse = reverse
        self.lhs, self.rhs = (spec["rhs"], spec["lhs"]) if reverse else (spec["lhs"], spec["rhs"])
        self.name = spec["name"] + ("-reverse" if reverse else "")
        self.origin = spec.get("origin", "generated")
        self.description = f"{_text(self.lhs)} -> {_text(self.rhs)}"
        self.inputs = dict(spec["inputs"])
        produced = {out for _, _, outputs, _ in self.rhs["nodes"] for out in outputs}
        read = _variables(self.rhs) | (set(self.rhs["outputs"]) - produced)
        missing = read - _variables(self.lhs)
        if missing:
            raise ValueError(
                f"rule {self.name}: the rhs reads {sorted(missing)}, unbound by the lhs"
            )
        if not self.lhs["nodes"]:
            raise ValueError("the pattern side has no operator")
        # An identity between elementwise ops holds element by element, so at any rank and
        # under broadcasting: the rank a template was found at binds only the others. (Where
        # broadcasting changes a result's shape, the applier's shape check turns the site away.)
        elementwise = {
            _op(n[0])[1] for n in (*self.lhs["nodes"], *self.rhs["nodes"])
        } <= ELEMENTWISE
        variables = {
            name: Var(
                rank=None if elementwise else info.get("rank"),
                const=bool(info.get("const", False)),
            )
            for name, info in self.inputs.items()
        }
        self.pattern = Pattern(_pattern_nodes(self.lhs), tuple(self.lhs["outputs"]), variables)
        self.anchor_ops = (self.pattern.anchor_op[1],)
        self.source_ops = _counts(self.lhs)
        self.target_ops = _counts(self.rhs)
        self.portable = all(_op(node[0])[0] in STANDARD_DOMAINS for node in self.rhs["nodes"])

    @property
    def equation(self) -> str:
        """Both sides as the nested expressions they are, e.g.
        `Transpose(MatMul(x0, x1), perm=[1,0]) => MatMul(Transpose(x1, perm=[1,0]), ...)`."""
        return f"{_expression(self.lhs)} => {_expression(self.rhs)}"

    def fingerprint(self) -> str:
        text = json.dumps([self.spec, self.reverse], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def anchors(self, index: GraphIndex) -> Sequence[Node]:
        return pattern_anchors([self.pattern], index)

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        for binding in self.pattern.match(graph, anchor):
            outputs = tuple(binding.values[name] for name in self.pattern.outputs)
            yield Match(binding.nodes, binding.values, outputs)

    def check(self, graph: Graph, match: Match) -> str | None:
        for var, info in self.inputs.items():
            if var in match.bindings and match[var]:
                if graph.value(match[var]).dtype != _DTYPES.get(info.get("dtype", "float")):
                    return f"{var} is not of type {info.get('dtype', 'float')}"
        try:
            prepare_replacement(graph, match, self.rewrite(graph, match))
        except RewriteRejected as error:
            return str(error)
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        names = {var: match[var] for var in self.pattern.variables}
        nodes = []
        for op_type, inputs, outputs, attrs in self.rhs["nodes"]:
            for out in outputs:
                names.setdefault(out, fresh_name(out))
            domain, op = _op(op_type)
            nodes.append(
                Node.make(
                    op,
                    [names[i] if i else "" for i in inputs],
                    [names[o] for o in outputs],
                    domain=domain,
                    **attrs,
                )
            )
        return Replacement(nodes, [names[out] for out in self.rhs["outputs"]])

    # ---- verification --------------------------------------------------------------------------

    def example(self, setting: int) -> onnx.ModelProto:
        """The lhs as a model, at the `setting`-th verified shape setting."""
        shapes = self.shape_settings()
        if not shapes:
            raise RewriteRejected(f"rule {self.name} has no shape setting where both sides type")
        builder = ModelBuilder(opset=TEMPLATE_OPSET, seed=setting)
        return _side_model(builder, self.lhs, self.inputs, shapes[setting % len(shapes)])

    def example_graph(self, setting: int) -> Graph:
        """The example as a Graph, without load-time constant folding: a template may rewrite
        ops on constants only (Concat of two conv weights), which folding would remove."""
        return graph_as_written(self.example(setting))

    def shape_settings(self) -> list[dict[str, tuple[int, ...]]]:
        """The generator's verified shapes, else shapes found by trying small random dims."""
        listed = self.spec.get("verified_shapes") or []
        order = list(self.inputs)
        settings = []
        for entry in listed:
            if isinstance(entry, Mapping):
                settings.append({k: tuple(v) for k, v in entry.items()})
            else:
                settings.append({k: tuple(v) for k, v in zip(order, entry, strict=False)})
        return settings or _search_shapes(self)


def graph_as_written(model: onnx.ModelProto) -> Graph:
    """A Graph of exactly the model's nodes, typed by ONNX shape inference (no folding)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    values = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = info.type.tensor_type
        dims = tuple(d.dim_value for d in tensor.shape.dim)
        values[info.name] = Value(info.name, tensor.elem_type, dims)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = [
        Node(n.op_type, list(n.input), list(n.output), {a.name: a for a in n.attribute}, n.domain)
        for n in model.graph.node
    ]
    inputs = [values[i.name] for i in model.graph.input if i.name not in initializers]
    outputs = [values[o.name] for o in model.graph.output]
    opset = {entry.domain: entry.version for entry in model.opset_import}
    return Graph(nodes, inputs, outputs, initializers, values, opset, ir_version=model.ir_version)


def _text(side: Mapping[str, Any]) -> str:
    return "; ".join(f"{','.join(o)} = {op}({', '.join(i)})" for op, i, o, _ in side["nodes"])


def _expression(side: Mapping[str, Any]) -> str:
    """A side's outputs as nested calls, attributes after the operands, output k of a
    multi-output op as `Op(...)[k]`, and several outputs as a tuple. A value read twice is
    written out twice: the sides are a few operators, and a tree reads more easily than
    named intermediates."""
    values: dict[str, str] = {}
    for op_type, inputs, outputs, attrs in side["nodes"]:
        operands = [values.get(name, name) for name in inputs]
        operands += [f"{key}={_attribute(value)}" for key, value in attrs.items()]
        call = f"{op_type}({', '.join(operands)})"
        for k, name in enumerate(outputs):
            values[name] = call if len(outputs) == 1 else f"{call}[{k}]"
    results = [values.get(name, name) for name in side["outputs"]]
    return results[0] if len(results) == 1 else f"({', '.join(results)})"


def _attribute(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _side_model(
    builder: ModelBuilder,
    side: Mapping[str, Any],
    inputs: Mapping[str, Any],
    shapes: Mapping[str, Sequence[int]],
) -> onnx.ModelProto:
    names: dict[str, str] = {}
    for var in sorted(_variables(side)):
        info = inputs.get(var, {})
        dtype = _DTYPES.get(info.get("dtype", "float"), onnx.TensorProto.FLOAT)
        if info.get("const"):
            names[var] = builder.const(tuple(shapes[var]))
        else:
            names[var] = builder.input(shapes[var], dtype)
    for op_type, node_inputs, outputs, attrs in side["nodes"]:
        domain, op = _op(op_type)
        made = builder.op(
            op,
            [names[i] if i else "" for i in node_inputs],
            outputs=len(outputs),
            domain=domain,
            **attrs,
        )
        made = [made] if len(outputs) == 1 else made
        names.update(zip(outputs, made, strict=False))
    return builder.model(*[names[out] for out in side["outputs"]])


def _search_shapes(rule: TemplateRule, wanted: int = 3, tries: int = 300) -> list[dict]:
    """Small shapes at which ONNX shape inference accepts both sides (for rules that list none)."""
    rng = np.random.default_rng(0)
    found: list[dict] = []
    for _ in range(tries):
        shapes = {
            var: tuple(int(d) for d in rng.integers(1, 6, size=info.get("rank", 2)))
            for var, info in rule.inputs.items()
        }
        if shapes in found:
            continue
        try:
            for side in (rule.lhs, rule.rhs):
                model = _side_model(ModelBuilder(opset=TEMPLATE_OPSET), side, rule.inputs, shapes)
                onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception:  # shape inference rejects the setting; try another
            continue
        found.append(shapes)
        if len(found) == wanted:
            break
    return found


def load_templates(
    path: str | os.PathLike | None = None, growing: bool = False
) -> list[TemplateRule]:
    """The rules of a generated-rules file (both directions of bidirectional ones).

    A directed rule that turns one operator into several (Relu(x) -> Relu(Relu(x)), the
    reverse of a simplification) has a site at every operator of its type and never helps by
    itself: it is left out unless `growing`. Missing default file: no generated rules. A
    malformed file raises RlflowError.
    """
    path = Path(path) if path is not None else GENERATED_PATH
    if not path.exists():
        if path == GENERATED_PATH:
            return []
        raise RlflowError(f"no such rules file: {path}")
    try:
        data = json.loads(path.read_text())
        if data.get("version") != 1:
            raise ValueError(f"unsupported version {data.get('version')!r}")
        specs = list(data["rules"])
    except (ValueError, KeyError, TypeError) as error:
        raise RlflowError(f"{path} is not a valid rules file: {error}") from None
    rules: list[TemplateRule] = []
    for spec in specs:
        for reverse in (False, True) if spec.get("bidirectional") else (False,):
            try:
                rule = TemplateRule(spec, reverse)
                if growing or len(rule.lhs["nodes"]) > 1 or len(rule.rhs["nodes"]) <= 1:
                    rules.append(rule)
            except (ValueError, KeyError, TypeError) as error:
                # One odd rule (say a reverse side with no operator to anchor on) must not
                # cost the others; it is reported and left out.
                name = spec.get("name", "?") + ("-reverse" if reverse else "")
                warnings.warn(f"generated rule {name} skipped: {error}", stacklevel=2)
    return rules
