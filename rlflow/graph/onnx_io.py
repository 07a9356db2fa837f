"""Load any ONNX model into a Graph with static shapes, and write a Graph back to ONNX.

Loading validates the file, fixes dynamic input dims from `input_shapes`, turns
Constant nodes into initializers, folds shape subgraphs and infers every value's
shape. Operators we know nothing about are kept as they are (opaque nodes).

Weights that an older export lists among its inputs are inputs with a default: a caller may
override them. They stay inputs of the Graph, never folded or rewritten as constants (their
defaults serve shape inference only), unless `fold_initializer_inputs` turns them into
constants. `load_with_interface` also returns the original's `Interface`, which puts these
inputs, and the symbolic dims `input_shapes` fixed, back on a written model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from rlflow.errors import RlflowError, first_line
from rlflow.graph.domains import is_standard, opset_for
from rlflow.graph.interface import MIN_IR_WITH_LOOSE_INITIALIZERS, Interface
from rlflow.graph.ir import Graph, Node, Value
from rlflow.graph.proto_text import invalid_text_field
from rlflow.graph.shapes import evaluate_node, fold_constants, infer_shapes, shapes_from_runtime

MAX_FOLD_ROUNDS = 8


def load_model(
    source: str | os.PathLike | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    fold_initializer_inputs: bool = False,
) -> Graph:
    """Load an ONNX file or ModelProto into a Graph whose every value has a static shape.

    Args:
        source: a path to an .onnx file, or a ModelProto.
        input_shapes: concrete shapes for inputs with dynamic dims, by input name; they must
            agree with the dims the model fixes.
        fold_initializer_inputs: weights listed among the inputs become constants (else
            they stay inputs).

    Raises:
        RlflowError: the file is missing or not a valid ONNX model, an input has dynamic
            dims and no shape was given, a given shape contradicts the model, or shapes cannot
            be determined.
    """
    return load_with_interface(
        source, input_shapes, fold_initializer_inputs=fold_initializer_inputs
    )[0]


def load_with_interface(
    source: str | os.PathLike | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    fold_initializer_inputs: bool = False,
) -> tuple[Graph, Interface]:
    """`load_model`, and the original's interface to restore on a model written from it."""
    model = _read(source) if not isinstance(source, onnx.ModelProto) else source
    label = str(source) if not isinstance(source, onnx.ModelProto) else "model"
    graph, defaults = _load(model, dict(input_shapes or {}), label, fold_initializer_inputs)
    listed = {info.name for info in model.graph.input}
    folded = [
        t.name for t in model.graph.initializer if t.name in listed and t.name not in defaults
    ]
    return graph, Interface(model, graph, defaults, folded, source)


def _read(path: str | os.PathLike) -> onnx.ModelProto:
    path = Path(path)
    if not path.exists():
        raise RlflowError(f"no such file: {path}")
    if path.is_dir():
        raise RlflowError(f"{path} is a directory, not an ONNX file")
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, OSError) as error:
        raise RlflowError(f"{path} is not a valid ONNX model ({first_line(error, 200)})") from None
    if not model.graph.node and not model.graph.output:
        raise RlflowError(f"{path} is not a valid ONNX model (it holds no graph)")
    damaged = invalid_text_field(model)  # before the checker, which cannot quote such text
    if damaged is not None:
        raise RlflowError(f"{path} is not a valid ONNX model ({damaged} is not UTF-8 text)")
    try:
        onnx.checker.check_model(_without_weights(model))
    except onnx.checker.ValidationError as error:
        # Outputs without a declared shape are legal ONNX that onnxruntime runs; we infer them.
        if "Field 'shape' of 'type' is required" not in str(error):
            reason = first_line(error, 200)
            raise RlflowError(f"{path} is not a valid ONNX model ({reason})") from None
    return model


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with large initializers turned into typed inputs, for a fast structural check.

    The checker serialises the whole model; with 0.5 GB of weights that dominates load time.
    """
    graph = model.graph
    light_graph = onnx.GraphProto(name=graph.name)
    light_graph.node.extend(graph.node)
    light_graph.input.extend(graph.input)
    light_graph.output.extend(graph.output)
    light_graph.value_info.extend(graph.value_info)
    listed = {vi.name for vi in graph.input}
    for tensor in graph.initializer:
        if len(tensor.raw_data) <= 1 << 16 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            light_graph.initializer.append(tensor)
        elif tensor.name not in listed:
            light_graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    light = onnx.ModelProto(
        ir_version=model.ir_version, graph=light_graph, producer_name=model.producer_name
    )
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    return light


def _load(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]],
    label: str,
    fold_initializer_inputs: bool,
) -> tuple[Graph, dict[str, np.ndarray]]:
    """The Graph of `model`, and the defaults of the weights listed among its inputs that
    stay inputs."""
    onnx_graph = model.graph
    initializers = {t.name: _tensor_to_array(t) for t in onnx_graph.initializer}
    opset_import = list(model.opset_import)
    listed = {vi.name for vi in onnx_graph.input}
    defaults = {
        name: initializers.pop(name)
        for name in list(initializers)
        if name in listed and not fold_initializer_inputs
    }
    input_protos = [vi for vi in onnx_graph.input if vi.name not in initializers]
    _check_shape_names(input_shapes, input_protos, initializers, label)
    inputs = [
        _static_input(vi, input_shapes.get(vi.name), defaults.get(vi.name)) for vi in input_protos
    ]
    dynamic = [f"{vi.name}{list(dims)}" for vi, dims in inputs if not _is_static(dims)]
    if dynamic:
        raise RlflowError(
            f"{label} has inputs with dynamic dims: {', '.join(dynamic)}; "
            "give each a shape with --input-shape NAME=1x3x224x224"
        )
    _check_symbols(inputs)

    nodes = list(onnx_graph.node)
    nodes = _constants_to_initializers(nodes, initializers, opset_import)
    static_inputs = [
        helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, dims)
        for vi, dims in inputs
    ]
    types: dict = {}
    for _ in range(MAX_FOLD_ROUNDS):
        working = _model_with(model, nodes, static_inputs, onnx_graph.output, {})
        types = infer_shapes(working, {**initializers, **defaults})
        before = len(nodes)
        nodes = fold_constants(nodes, initializers, types, opset_import)
        if len(nodes) == before:
            break

    missing = [
        name
        for node in nodes
        for name in node.output
        if name and not _is_static(types.get(name, (0, None))[1])
    ]
    missing += [
        o.name
        for o in onnx_graph.output
        if not _is_static(types.get(o.name, (0, None))[1])
        and o.name not in missing
        and o.name not in initializers
    ]
    if missing:
        constants = {**initializers, **defaults}
        working = _model_with(model, nodes, static_inputs, onnx_graph.output, constants)
        types.update(shapes_from_runtime(working, missing))

    values: dict[str, Value] = {}
    for name, (dtype, dims) in types.items():
        if dims is not None and _is_static(dims):
            values[name] = Value(name, dtype, tuple(int(d) for d in dims))
    graph_inputs = [values[vi.name] for vi, _ in inputs]
    graph_outputs = []
    for output in onnx_graph.output:
        if output.name in initializers:
            array = initializers[output.name]
            values[output.name] = Value(
                output.name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
            )
        graph_outputs.append(values[output.name])
    ir_nodes = [_node_from_proto(node) for node in nodes]
    graph = Graph(
        ir_nodes,
        graph_inputs,
        graph_outputs,
        initializers,
        values,
        {imp.domain: imp.version for imp in opset_import},
        metadata={p.key: p.value for p in model.metadata_props},
        name=onnx_graph.name or "graph",
        ir_version=model.ir_version,
        functions=list(model.functions),
    )
    return graph.pruned(), defaults


def _check_shape_names(
    input_shapes: Mapping[str, Sequence[int]],
    input_protos: Sequence[onnx.ValueInfoProto],
    initializers: Mapping[str, np.ndarray],
    label: str,
) -> None:
    """RlflowError for a shape given to a name that is not an input of the model."""
    inputs = {vi.name for vi in input_protos}
    for name in input_shapes:
        if name not in inputs:
            what = "a weight (a constant)" if name in initializers else "not an input"
            names = ", ".join(vi.name for vi in input_protos) or "none"
            raise RlflowError(f"--input-shape {name}: {name} is {what} of {label}; inputs: {names}")


def _static_input(
    vi: onnx.ValueInfoProto, override: Sequence[int] | None, default: np.ndarray | None = None
) -> tuple[onnx.ValueInfoProto, tuple]:
    """The input with the dims it is loaded with: its declared ones, `override` for dynamic
    ones (RlflowError where it contradicts the model), or its default's for a weight."""
    tensor_type = vi.type.tensor_type
    dims = tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in tensor_type.shape.dim
    )
    if default is not None:
        dims, declared = tuple(default.shape), "x".join(map(str, default.shape)) or "scalar"
        if override is not None and tuple(override) != dims:
            raise RlflowError(
                f"--input-shape {vi.name}={_text(override)}: {vi.name} is a weight listed among "
                f"the inputs, of shape {declared}"
            )
        return vi, dims
    if override is None:
        return vi, dims if tensor_type.HasField("shape") else ("?",)
    given = f"--input-shape {vi.name}={_text(override)}"
    if any(int(d) < 1 for d in override):
        raise RlflowError(f"{given}: every dim must be at least 1")
    if tensor_type.HasField("shape"):
        if len(override) != len(dims):
            raise RlflowError(f"{given} has {len(override)} dims; {vi.name} has {len(dims)}")
        declared = "x".join("?" if d is None else str(d) for d in dims) or "scalar"
        for axis, (dim, size) in enumerate(zip(dims, override)):
            if isinstance(dim, int) and dim != int(size):
                raise RlflowError(
                    f"{given} contradicts the model: {vi.name} is {declared}, "
                    f"its dim {axis} fixed at {dim}"
                )
    return vi, tuple(int(d) for d in override)


def _check_symbols(inputs: Sequence[tuple[onnx.ValueInfoProto, tuple]]) -> None:
    """RlflowError where one symbolic dim (`N`) is given two sizes in different places."""
    sizes: dict[str, tuple[int, str]] = {}
    for vi, dims in inputs:
        for dim, size in zip(vi.type.tensor_type.shape.dim, dims):
            if not dim.dim_param:
                continue
            seen = sizes.setdefault(dim.dim_param, (size, vi.name))
            if seen[0] != size:
                raise RlflowError(
                    f"--input-shape gives the model's dim {dim.dim_param} two sizes: "
                    f"{seen[0]} in {seen[1]}, {size} in {vi.name}"
                )


def _text(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


def _is_static(dims) -> bool:
    return dims is not None and all(isinstance(d, int) and d >= 0 for d in dims)


def _constants_to_initializers(
    nodes: list[onnx.NodeProto],
    initializers: dict[str, np.ndarray],
    opset_import: list[onnx.OperatorSetIdProto],
) -> list[onnx.NodeProto]:
    remaining = []
    for node in nodes:
        if node.op_type == "Constant" and is_standard(node.domain):
            values = evaluate_node(node, {}, opset_import)
            if values is not None:
                initializers[node.output[0]] = values[0]
                continue
        remaining.append(node)
    return remaining


def _model_with(model, nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        model.graph.name or "graph",
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    working = helper.make_model(
        graph, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    working.functions.extend(model.functions)
    return working


def _tensor_to_array(tensor: onnx.TensorProto) -> np.ndarray:
    """A read-only array over the tensor's raw bytes (one copy, where to_array makes two).

    Read-only is what we want: constants are shared between graphs and never mutated.
    """
    if tensor.raw_data and tensor.data_location != onnx.TensorProto.EXTERNAL:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if dtype.kind in "biuf" and dtype.itemsize in (1, 2, 4, 8) and dtype.isnative:
            array = np.frombuffer(tensor.raw_data, dtype=dtype)
            return array.reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


def _node_from_proto(proto: onnx.NodeProto) -> Node:
    return Node(
        proto.op_type,
        list(proto.input),
        list(proto.output),
        {attr.name: attr for attr in proto.attribute},
        proto.domain,
        proto.name,
    )


def graph_to_onnx(graph: Graph) -> onnx.ModelProto:
    """Write a Graph as a ModelProto with full shape information (value_info for every value)."""
    node_protos = []
    for node, name in zip(graph.nodes, _node_names(graph.nodes)):
        proto = onnx.NodeProto(
            op_type=node.op_type,
            name=name,
            domain=node.domain,
            input=node.inputs,
            output=node.outputs,
        )
        proto.attribute.extend(node.attrs.values())
        node_protos.append(proto)
    interface = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    value_info = [
        _value_info(graph.values[out])
        for node in graph.nodes
        for out in node.outputs
        if out and out not in interface and out in graph.values
    ]
    onnx_graph = helper.make_graph(
        node_protos,
        graph.name,
        [_value_info(v) for v in graph.inputs],
        [_value_info(v) for v in graph.outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in graph.initializers.items()],
        value_info=value_info,
    )
    opset = opset_for(graph.opset, (node.domain for node in graph.nodes))
    model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opset.items()],
        producer_name="rlflow",
    )
    # Keep the source's IR version; a graph built in code gets the lowest that its opsets
    # allow (onnx writes its newest by default, which onnxruntime may not read yet). Constants
    # are never inputs of a Graph, which IR 3 does not allow: such a source is written as IR 4.
    model.ir_version = graph.ir_version or helper.find_min_ir_version_for(model.opset_import)
    if graph.initializers:
        model.ir_version = max(model.ir_version, MIN_IR_WITH_LOOSE_INITIALIZERS)
    model.functions.extend(graph.functions)
    for key, value in graph.metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return model


def _node_names(nodes: Sequence[Node]) -> list[str]:
    """A unique name per node (onnxruntime refuses duplicates): its own where it is the first
    to hold it, else `OpType_index`, made unique against every name kept."""
    names: list[str] = []
    taken: set[str] = set()
    for node in nodes:
        names.append(node.name if node.name and node.name not in taken else "")
        taken.add(node.name)
    for index, node in enumerate(nodes):
        if not names[index]:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            names[index] = name
            taken.add(name)
    return names


def _value_info(value: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, value.dtype, value.shape)
