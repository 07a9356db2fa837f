"""Static shapes for every value: ONNX shape inference, constant folding of shape subgraphs,
and, for operators ONNX cannot infer (contrib or custom ops), one run in onnxruntime.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.errors import RlflowError, first_line
from rlflow.graph.domains import is_standard

# Constants larger than this are handed to shape inference as typed inputs, not data:
# it needs only the small ones (shape vectors) and copying weights would dominate load time.
_SMALL_CONST = 4096
# A node whose inputs are all constants of at most this many elements is folded at load,
# which turns Shape->Gather->Unsqueeze->Concat->Reshape chains into plain constants.
_FOLD_INPUT_LIMIT = 4096
NONDETERMINISTIC_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)


def infer_shapes(
    model: onnx.ModelProto, initializers: dict[str, np.ndarray]
) -> dict[str, tuple[int, tuple[int | str | None, ...]]]:
    """Run ONNX shape inference; return name -> (elem type, dims) for every value it typed.

    Dims are ints when known, a str (symbol) or None when not.
    """
    graph = model.graph
    light = onnx.GraphProto(name=graph.name)
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    listed = {info.name for info in graph.input}  # weights listed as inputs: typed already
    for name, array in initializers.items():
        if array.size <= _SMALL_CONST:
            light.initializer.append(numpy_helper.from_array(array, name))
        elif name not in listed:
            light.input.append(
                helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
                )
            )
    light_model = helper.make_model(
        light, opset_imports=model.opset_import, ir_version=model.ir_version
    )
    light_model.functions.extend(model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(light_model, strict_mode=False, data_prop=True)
    except Exception as error:  # onnx raises several types; all mean the same to a user
        raise RlflowError(f"ONNX shape inference failed: {first_line(error)}") from None
    types: dict[str, tuple[int, tuple[int | str | None, ...]]] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape"):
            types.setdefault(info.name, (tensor_type.elem_type, None))  # type: ignore[arg-type]
            continue
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        types[info.name] = (tensor_type.elem_type, tuple(dims))
    return types


def fold_constants(
    nodes: list[onnx.NodeProto],
    initializers: dict[str, np.ndarray],
    types: dict[str, tuple[int, tuple[int | str | None, ...]]],
    opset_import: list[onnx.OperatorSetIdProto],
) -> list[onnx.NodeProto]:
    """Evaluate small all-constant nodes (and Shape/Size of static tensors) into constants.

    Adds the results to `initializers` and returns the nodes that remain.
    """
    remaining: list[onnx.NodeProto] = []
    for node in nodes:
        folded = _fold_one(node, initializers, types, opset_import)
        if folded is None:
            remaining.append(node)
            continue
        for name, array in zip(node.output, folded):
            if name:
                initializers[name] = array
    return remaining


def _fold_one(node, initializers, types, opset_import) -> list[np.ndarray] | None:
    if not is_standard(node.domain) or node.op_type in NONDETERMINISTIC_OPS:
        return None
    if any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for attr in node.attribute
    ):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] not in initializers:
        known = types.get(node.input[0])
        if known is None or known[1] is None or not all(isinstance(d, int) for d in known[1]):
            return None
        dims = np.array(known[1], dtype=np.int64)
        if node.op_type == "Size":
            return [np.array(np.prod(dims), dtype=np.int64)]
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), None)
        return [dims[start:end]]
    present = [name for name in node.input if name]
    if not present or not all(name in initializers for name in present):
        return None
    if any(initializers[name].size > _FOLD_INPUT_LIMIT for name in present):
        return None
    return evaluate_node(node, initializers, opset_import)


def evaluate_node(
    node: onnx.NodeProto,
    initializers: dict[str, np.ndarray],
    opset_import: list[onnx.OperatorSetIdProto],
) -> list[np.ndarray] | None:
    """Run one node on constant inputs with the ONNX reference evaluator (None if it can't)."""
    from onnx.reference import ReferenceEvaluator

    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(initializers[name].dtype), None
        )
        for name in dict.fromkeys(n for n in node.input if n)
    ]
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=opset_import)
    try:
        session = ReferenceEvaluator(model)
        results = session.run(None, {i.name: initializers[i.name] for i in inputs})
    except Exception:  # an op the reference evaluator lacks: keep the node
        return None
    return [np.asarray(r) for r in results]


@functools.cache
def max_ort_ir_version() -> int:
    """The newest ONNX IR version this onnxruntime loads, found by trying a one-node model."""
    import onnxruntime as ort

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    for version in range(onnx.IR_VERSION, 3, -1):
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        probe.ir_version = version
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's error types differ by version; any means "too new"
            continue
        return version
    return onnx.IR_VERSION


def shapes_from_runtime(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[int, tuple]]:
    """Types of values ONNX could not infer, read off one onnxruntime run on zero inputs."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    # A model written by a newer onnx than this onnxruntime reads (the probe needs no newer
    # IR feature): onnxruntime would refuse it as "Unsupported" before running anything.
    probe.ir_version = min(probe.ir_version, max_ort_ir_version())
    known_outputs = {o.name for o in probe.graph.output}
    for name in names:
        if name not in known_outputs:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    # The CPU first; then CUDA where onnxruntime has it, for graphs that onnxruntime optimised
    # for CUDA and that hold operators only CUDA implements (BiasSoftmax, for one).
    attempts = [["CPUExecutionProvider"]]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        attempts.append(["CUDAExecutionProvider", "CPUExecutionProvider"])
    for providers in attempts:
        try:
            session = ort.InferenceSession(probe.SerializeToString(), options, providers=providers)
            feeds = {}
            for arg in session.get_inputs():
                dtype = _ORT_NUMPY.get(arg.type, np.float32)
                feeds[arg.name] = np.zeros(arg.shape, dtype=dtype)
            results = session.run(names, feeds)
            break
        except Exception as error:
            failure = error
    else:
        raise RlflowError(
            f"could not determine the shapes of {len(names)} values "
            f"(e.g. {names[0]!r}): {first_line(failure)}"
        ) from None
    return {
        name: (helper.np_dtype_to_tensor_dtype(np.asarray(r).dtype), tuple(np.shape(r)))
        for name, r in zip(names, results)
    }


_ORT_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
