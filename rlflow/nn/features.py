"""Graph featurisation: an IR `Graph` as the fixed-size arrays of a GraphRewrite-v0 observation.

Numpy only (no torch): the env builds its observations here, and `rlflow.nn.data` turns them
into torch_geometric batches for the GNN. The vocabularies below are fixed so that observations
of different models, and checkpoints of different runs, line up.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from onnx import TensorProto

from rlflow.cost import AnalyticCostModel
from rlflow.errors import RlflowError
from rlflow.graph import STANDARD_DOMAINS, Graph

# fmt: off
OP_TYPES: tuple[str, ...] = (
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Relu", "Clip",
    "MatMul", "Gemm", "FusedMatMul", "Conv", "FusedConv", "BatchNormalization",
    "LayerNormalization", "SkipLayerNormalization", "Softmax", "Gelu", "BiasGelu", "FastGelu",
    "ReduceMean", "MaxPool", "AveragePool", "GlobalAveragePool", "Reshape", "Transpose",
    "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Expand", "Where",
    "Cast", "Identity", "Dropout", "Pad",
)
"""The op-type vocabulary of the one-hot node feature, fixed so that observations of different
models (and checkpoints of different runs) line up; anything else falls in the "other" slot."""
# fmt: on
NODE_SCALARS: tuple[str, ...] = (
    "log_out_numel",  # log1p(elements of the first output) / LOG_SCALE
    "out_rank",  # rank of the first output / 8
    "cost_share",  # the node's analytic time / the graph's analytic time
    "log_time_us",  # log1p(the node's analytic time in microseconds) / LOG_TIME
    "log_flops",  # log1p(FLOPs) / LOG_SCALE
    "log_bytes",  # log1p(bytes moved) / LOG_SCALE
    "is_output",  # 1 if the node computes a graph output
    "reads_input",  # 1 if the node reads a graph input
    "const_inputs",  # number of constant (initializer) inputs / 4
    "log_const_numel",  # log1p(elements of its constant inputs) / LOG_SCALE
    "log_fanout",  # log1p(edges leaving the node) / 4
    "num_outputs",  # number of outputs / 4
    "contrib",  # 1 for an operator outside the standard ONNX domain (e.g. com.microsoft)
)
NODE_FEATURES: tuple[str, ...] = (*(f"op={op}" for op in OP_TYPES), "op=other", *NODE_SCALARS)
EDGE_FEATURES: tuple[str, ...] = (
    "log_numel",  # log1p(elements of the tensor) / LOG_SCALE
    "rank",  # rank / 8
    "log_last_dim",  # log1p(last dim) / LOG_DIM
    "log_second_last_dim",  # log1p(second-to-last dim) / LOG_DIM
    "log_leading_dims",  # log1p(product of the other dims) / LOG_DIM
    "input_slot",  # which input of the consumer the tensor feeds, min(slot, 7) / 7
    "is_float",  # 1 for a floating-point tensor
)
GLOBAL_FEATURES: tuple[str, ...] = (
    "cost_ratio",  # C_t / C_0 in the reward's cost source (the e2e-sparse running estimate)
    "analytic_ratio",  # analytic cost now / analytic cost of the original graph
    "step_fraction",  # steps taken / horizon, at most 1
    "node_ratio",  # operators now / operators in the original graph
    "candidate_fill",  # candidates offered / max_candidates
    "candidates_capped",  # 1 if some candidates were left out by the max_candidates cap
    "log_original_cost",  # log1p(original analytic cost in microseconds) / LOG_TIME
    "node_fill",  # operators now / max_nodes
)
LOG_SCALE = 25.0  # log1p(7e10) = 25: element, FLOP and byte counts of any zoo model fit under 1
LOG_DIM = 12.0  # log1p(160k) = 12: any single dimension
LOG_TIME = 15.0  # log1p(3.3e6 us) = 15: over a second per node or graph
GLOBAL_MAX = 10.0  # bound of the global features: a graph ten times slower is already absurd

_FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
)
_OP_INDEX = {op: index for index, op in enumerate(OP_TYPES)}


def graph_edges(graph: Graph) -> list[tuple[int, int, str, int]]:
    """(producer index, consumer index, tensor name, input slot) of every operator-to-operator
    edge, consumers in graph order, slots in order."""
    producer = {out: index for index, node in enumerate(graph.nodes) for out in node.outputs if out}
    return [
        (producer[name], consumer, name, slot)
        for consumer, node in enumerate(graph.nodes)
        for slot, name in enumerate(node.inputs)
        if name in producer
    ]


def count_edges(graph: Graph) -> int:
    """The number of operator-to-operator edges (as in `graph_edges`)."""
    return sum(1 for node in graph.nodes for name in node.inputs if name and graph.producer(name))


def featurize(
    graph: Graph, analytic: AnalyticCostModel, *, max_nodes: int, max_edges: int
) -> dict[str, np.ndarray]:
    """The graph part of the observation: node_features, node_mask, edge_index, edge_features,
    edge_mask (see GraphRewriteEnv's docstring). The graph must fit the sizes."""
    nodes = graph.nodes
    if len(nodes) > max_nodes:
        raise RlflowError(f"graph has {len(nodes)} operators, more than max_nodes={max_nodes}")
    edges = graph_edges(graph)
    if len(edges) > max_edges:
        raise RlflowError(f"graph has {len(edges)} edges, more than max_edges={max_edges}")
    inputs = {value.name for value in graph.inputs}
    outputs = {value.name for value in graph.outputs}
    fanout = np.zeros(len(nodes), dtype=np.float64)
    for source, _, _, _ in edges:
        fanout[source] += 1

    other = len(OP_TYPES)
    scalars = len(OP_TYPES) + 1
    node_features = np.zeros((max_nodes, len(NODE_FEATURES)), dtype=np.float32)
    costs = [analytic.node_cost(graph, node) for node in nodes]
    times = [analytic.op_time_ms(cost, node.op_type) for cost, node in zip(costs, nodes)]
    total = sum(times)
    for index, node in enumerate(nodes):
        row = node_features[index]
        row[_OP_INDEX.get(node.op_type, other)] = 1.0
        first = graph.values.get(node.outputs[0]) if node.outputs and node.outputs[0] else None
        consts = [name for name in node.present_inputs if graph.is_constant(name)]
        const_numel = sum(graph.value(name).numel for name in consts)
        row[scalars:] = (
            math.log1p(first.numel) / LOG_SCALE if first is not None else 0.0,
            len(first.shape) / 8 if first is not None else 0.0,
            times[index] / total if total > 0 else 0.0,
            math.log1p(times[index] * 1e3) / LOG_TIME,
            math.log1p(costs[index].flops) / LOG_SCALE,
            math.log1p(costs[index].bytes) / LOG_SCALE,
            float(any(out in outputs for out in node.outputs)),
            float(any(name in inputs for name in node.inputs)),
            len(consts) / 4,
            math.log1p(const_numel) / LOG_SCALE,
            math.log1p(fanout[index]) / 4,
            len(node.outputs) / 4,
            float(node.domain not in STANDARD_DOMAINS),
        )
    node_mask = np.zeros(max_nodes, dtype=np.int8)
    node_mask[: len(nodes)] = 1

    edge_index = np.zeros((2, max_edges), dtype=np.int64)
    edge_features = np.zeros((max_edges, len(EDGE_FEATURES)), dtype=np.float32)
    for index, (source, target, name, slot) in enumerate(edges):
        edge_index[0, index], edge_index[1, index] = source, target
        edge_features[index] = _tensor_features(graph, name, slot)
    edge_mask = np.zeros(max_edges, dtype=np.int8)
    edge_mask[: len(edges)] = 1
    return {
        "node_features": np.clip(node_features, 0.0, 1.0),
        "node_mask": node_mask,
        "edge_index": edge_index,
        "edge_features": np.clip(edge_features, 0.0, 1.0),
        "edge_mask": edge_mask,
    }


@functools.lru_cache(maxsize=65536)
def _shape_features(shape: tuple[int, ...], dtype: int, slot: int) -> tuple[float, ...]:
    numel = math.prod(shape)
    last = shape[-1] if shape else 1
    second = shape[-2] if len(shape) > 1 else 1
    leading = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return (
        math.log1p(numel) / LOG_SCALE,
        len(shape) / 8,
        math.log1p(last) / LOG_DIM,
        math.log1p(second) / LOG_DIM,
        math.log1p(leading) / LOG_DIM,
        min(slot, 7) / 7,
        float(dtype in _FLOAT_TYPES),
    )


def _tensor_features(graph: Graph, name: str, slot: int) -> tuple[float, ...]:
    value = graph.values.get(name)
    if value is None:
        return (0.0,) * len(EDGE_FEATURES)
    return _shape_features(tuple(value.shape), value.dtype, slot)


def global_features(
    *,
    cost_ratio: float,
    analytic_ratio: float,
    step_fraction: float,
    node_ratio: float,
    candidate_fill: float,
    candidates_capped: bool,
    original_cost_ms: float,
    node_fill: float,
) -> np.ndarray:
    """The `global_features` vector (`GLOBAL_FEATURES`, in that order), bounded to
    [0, GLOBAL_MAX]; the env's observations and its candidate observations both build it here."""
    values = np.array(
        [
            cost_ratio,
            analytic_ratio,
            min(step_fraction, 1.0),
            node_ratio,
            candidate_fill,
            float(candidates_capped),
            math.log1p(original_cost_ms * 1e3) / LOG_TIME,
            node_fill,
        ],
        dtype=np.float32,
    )
    return np.clip(values, 0.0, GLOBAL_MAX)
