"""The graph IR: load an ONNX model into a Graph with static shapes, hash it, write it back."""

from rlflow.graph.domains import (
    DEFAULT_OPSET,
    MS_DOMAIN,
    NCHWC_DOMAIN,
    STANDARD_DOMAINS,
    is_standard,
    onnx_opset,
)
from rlflow.graph.interface import Interface
from rlflow.graph.ir import Graph, GraphError, Node, Value, fresh_name, topological_order
from rlflow.graph.onnx_io import graph_to_onnx, load_model, load_with_interface

__all__ = [
    "DEFAULT_OPSET",
    "MS_DOMAIN",
    "NCHWC_DOMAIN",
    "STANDARD_DOMAINS",
    "is_standard",
    "onnx_opset",
    "Graph",
    "GraphError",
    "Interface",
    "Node",
    "Value",
    "fresh_name",
    "graph_to_onnx",
    "load_model",
    "load_with_interface",
    "topological_order",
]
