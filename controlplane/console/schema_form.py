"""The console's form fields, read from the API's own pydantic models (common.schemas).

``fields_of(Model, skip=..., choices=...)`` walks ``Model.model_fields`` in declaration order and
makes one FormField per field an operator sets: its kind from the annotation (int/float: number,
bool: checkbox, Literal: select of its values, list[str]: textarea one per line, a nested
pydantic model: its own fields as ``parent.child``), required and default from the field, the
hint from its description. A field added to the API's model therefore shows up in the form
without editing the console. What is not the operator's to set (status, timestamps, what the
server fills) is named in ``skip``; a select whose values live elsewhere (the runtime table,
the routing strategies, names of other objects) is given in ``choices``.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# Never an operator's to set on any form.
SERVER_SET = frozenset({"created_at", "status", "tenant", "updated_at"})


@dataclass
class FormField:
    name: str
    label: str
    kind: str = "text"  # text | number | select | textarea | checkbox
    required: bool = False
    hint: str = ""
    options: list[str] = field(default_factory=list)
    default: str = ""
    integer: bool = False  # a number field that takes whole numbers only
    lines: bool = False  # a textarea whose lines are a list's items


def _bare(annotation):
    """The annotation without None (X | None, Optional[X])."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _label(name: str) -> str:
    words = name.replace("_", " ").strip()
    for short, full in (("gib", "(GiB)"), ("gpu", "GPU"), ("vram", "VRAM"), ("mig", "MIG"), ("cpu", "CPU"),
                        ("secs", "(s)"), ("ttft", "TTFT"), ("l7", "L7"), ("url", "URL")):
        words = " ".join(full if w == short else w for w in words.split())
    return words[:1].upper() + words[1:]


def _default(info: FieldInfo) -> str:
    value = info.default
    if value is PydanticUndefined or value is None or isinstance(value, (list, dict, BaseModel)):
        return ""
    if isinstance(value, bool):
        return "on" if value else ""
    return str(value)


def fields_of(model: type[BaseModel], *, skip: typing.Collection[str] = (), choices: dict[str, list[str]] | None = None,
              prefix: str = "", labels: dict[str, str] | None = None) -> list[FormField]:
    choices, labels = choices or {}, labels or {}
    out: list[FormField] = []
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        if name in SERVER_SET or dotted in skip or info.exclude:
            continue
        ann = _bare(info.annotation)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += fields_of(ann, skip=skip, choices=choices, prefix=f"{dotted}.", labels=labels)
            continue
        f = FormField(dotted, labels.get(dotted) or _label(name), required=info.is_required(),
                      hint=info.description or "", default=_default(info))
        if dotted in choices:
            f.kind, f.options = "select", list(choices[dotted])
        elif typing.get_origin(ann) is typing.Literal:
            f.kind, f.options = "select", [str(a) for a in typing.get_args(ann)]
        elif ann is bool:
            f.kind = "checkbox"
        elif ann in (int, float):
            f.kind, f.integer = "number", ann is int
        elif typing.get_origin(ann) is list and _bare(typing.get_args(ann)[0]) in (str,) or \
                typing.get_origin(ann) is list and typing.get_origin(typing.get_args(ann)[0]) is typing.Annotated:
            f.kind, f.lines = "textarea", True
            f.hint = (f.hint + "; " if f.hint else "") + "one per line"
        elif typing.get_origin(ann) in (list, dict):
            continue  # structured lists (adapters, provider keys) have forms of their own or the CLI
        out.append(f)
    return out
