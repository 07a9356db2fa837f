"""Find text fields of an ONNX model that are not UTF-8: the mark of a damaged file.

ONNX's string fields (names, op types, doc strings, ...) are proto2 `string`s, which protobuf
parses without checking their encoding. Python's protobuf then hands back `bytes` for a field
that is not UTF-8 instead of `str`, and onnx's checker fails with a UnicodeDecodeError when its
message quotes one. A byte flipped inside a node's name thus surfaces far from the file, as a
traceback in the checker, in onnxruntime or in the writer; `invalid_text_field` names the
field at load time instead.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def invalid_text_field(message: Message, path: str = "model") -> str | None:
    """The first string field under `message` that is not UTF-8, as a path such as
    `model.graph.node[12].name`, or None when all are. Only string and message fields are
    visited, so a model's weights (bytes fields) are never copied."""
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            values = getattr(message, field.name)
            if not _is_repeated(field):
                values = [values]
            for index, value in enumerate(values):
                if isinstance(value, bytes):
                    suffix = f"[{index}]" if _is_repeated(field) else ""
                    return f"{path}.{field.name}{suffix}"
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if _is_repeated(field):
                children = list(enumerate(getattr(message, field.name)))
            elif message.HasField(field.name):
                children = [(None, getattr(message, field.name))]
            else:
                continue
            for index, child in children:
                where = f"{path}.{field.name}" + ("" if index is None else f"[{index}]")
                found = invalid_text_field(child, where)
                if found is not None:
                    return found
    return None


def _is_repeated(field: FieldDescriptor) -> bool:
    # `is_repeated` replaces `label` in newer protobuf releases; older ones only have `label`.
    repeated = getattr(field, "is_repeated", None)
    return field.label == FieldDescriptor.LABEL_REPEATED if repeated is None else repeated
