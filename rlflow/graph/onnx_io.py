"""Load any ONNX model into a Graph with static shapes, and write a Graph back to ONNX.

Loading validates the file, fixes dynamic input dims from `input_shapes`, turns
Constant nodes into initializers, folds shape subgraphs and infers every value's
shape. Operators we know nothing about are kept as they are (opaque nodes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from rlflow.errors import RlflowError, first_line
from rlflow.graph.domains import is_standard, opset_for
from rlflow.graph.ir import Graph, Node, Value
from rlflow.graph.shapes import evaluate_node, fold_constants, infer_shapes, shapes_from_runtime

MAX_FOLD_ROUNDS = 8


def load_model(
    source: str | os.PathLike | onnx.ModelProto,
    input_shapes: dict[str, Sequence[int]] | None = None,
) -> Graph:
    """Load an ONNX file or ModelProto into a Graph whose every value has a static shape.

    Args:
        source: a path to an .onnx file, or a ModelProto.
        input_shapes: concrete shapes for inputs with dynamic dims, by input name.

    Raises:
        RlflowError: the file is missing or not a valid ONNX model, an input has dynamic
            dims and no shape was given, or shapes cannot be determined.
    """
    model = _read(source) if not isinstance(source, onnx.ModelProto) else source
    label = str(source) if not isinstance(source, onnx.ModelProto) else "model"
    return graph_from_onnx(model, input_shapes or {}, label)


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


def graph_from_onnx(
    model: onnx.ModelProto, input_shapes: dict[str, Sequence[int]], label: str = "model"
) -> Graph:
    onnx_graph = model.graph
    initializers = {t.name: _tensor_to_array(t) for t in onnx_graph.initializer}
    opset_import = list(model.opset_import)
    # Old exporters list initializers among the inputs too; they are constants, not inputs.
    input_protos = [vi for vi in onnx_graph.input if vi.name not in initializers]
    unknown = set(input_shapes) - {vi.name for vi in input_protos}
    if unknown:
        names = ", ".join(sorted(vi.name for vi in input_protos))
        raise RlflowError(
            f"--input-shape names unknown input(s) {sorted(unknown)}; inputs: {names}"
        )
    inputs = [_static_input(vi, input_shapes.get(vi.name)) for vi in input_protos]
    dynamic = [f"{vi.name}{list(dims)}" for vi, dims in inputs if not _is_static(dims)]
    if dynamic:
        raise RlflowError(
            f"{label} has inputs with dynamic dims: {', '.join(dynamic)}; "
            "give each a shape with --input-shape NAME=1x3x224x224"
        )

    nodes = list(onnx_graph.node)
    nodes = _constants_to_initializers(nodes, initializers, opset_import)
    static_inputs = [
        helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, dims)
        for vi, dims in inputs
    ]
    types: dict = {}
    for _ in range(MAX_FOLD_ROUNDS):
        working = _model_with(model, nodes, static_inputs, onnx_graph.output, {})
        types = infer_shapes(working, initializers)
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
        working = _model_with(model, nodes, static_inputs, onnx_graph.output, initializers)
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
    return graph.pruned()


def _static_input(
    vi: onnx.ValueInfoProto, override: Sequence[int] | None
) -> tuple[onnx.ValueInfoProto, tuple]:
    tensor_type = vi.type.tensor_type
    dims = tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in tensor_type.shape.dim
    )
    if override is not None:
        if len(override) != len(dims) and tensor_type.HasField("shape"):
            raise RlflowError(
                f"--input-shape for {vi.name} has {len(override)} dims, the model has {len(dims)}"
            )
        dims = tuple(int(d) for d in override)
    elif not tensor_type.HasField("shape"):
        dims = ("?",)
    return vi, dims


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
    used_names: set[str] = set()
    node_protos = []
    for index, node in enumerate(graph.nodes):
        name = node.name if node.name and node.name not in used_names else f"{node.op_type}_{index}"
        used_names.add(name)
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
    # allow (onnx writes its newest by default, which onnxruntime may not read yet).
    model.ir_version = graph.ir_version or helper.find_min_ir_version_for(model.opset_import)
    model.functions.extend(graph.functions)
    for key, value in graph.metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return model


def _value_info(value: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(value.name, value.dtype, value.shape)
