"""Serialized fragments: every built-in fragment as a plain JSON-able dict, and back.

`from_fragment` turns a fragment into ``{"type": <name>, ...fields}`` and
`to_fragment` turns such a dict back into the fragment, exactly:

```python
from_fragment(term("NPL", "non-performing loan"))
# {"type": "term", "name": "NPL", "definition": "non-performing loan"}
to_fragment({"type": "hint", "text": "Use CTEs"}) == hint("Use CTEs")
```

The built-in types and their fields (``?`` marks an optional field, left out when None):

| type | fields |
|---|---|
| role | content |
| hint | text |
| term | name, definition |
| guardrail | rule, reason?, action? |
| explain | concept, explanation, therefore? |
| example | question, answer, note? |
| clarification | when, ask, reason |
| workflow | task, steps (list of str), triggers? (list of str), notes? |
| quirk | issue, workaround |
| style_guide | prefer, never?, always?   (``styleGuide`` is accepted as input too) |
| analogy | concepts (list of str), relationship, insight?, therefore?, pitfall? |
| glossary | entries (dict of str to str) |
| principle | title, description, policies? (list of values) |
| policy | rule, before?, reason?, policies? (list of values) |
| identity | name?, role? |
| persona | name, role?, objective?, tone? |
| alias | term, meaning |
| preference | aspect, value |
| correction | subject, clarification |
| fragment | name, children (list of values) or data (a value), id?, persist?, metadata? |

A *value* is a JSON primitive, a list of values, a dict of values, or a serialized fragment
(a dict with a string ``"type"``). A plain dict that has a string ``"type"`` key of its own is
wrapped as ``{"type": "$object", "value": {...}}`` so that it is not mistaken for a fragment.

Any fragment that matches no built-in shape exactly (a builder's output changed by hand, a
fragment with an id or metadata, a custom name) is serialized as the generic ``fragment``
type, so every non-message fragment with JSON-able data round-trips exactly. Custom types
are added with a `FragmentRegistry`. Message fragments are refused: they are stored by
the engine (``ContextEngine.save()``), and a message serializes with ``Message.model_dump()``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentcontext import fragments as _f
from agentcontext.errors import SerializationError
from agentcontext.fragments import ContextFragment, FragmentData, is_message_fragment

__all__ = ["FragmentRegistry", "from_fragment", "to_fragment"]

_OBJECT = "$object"
_MESSAGE_TYPES = frozenset({"user", "assistant", "system", "message"})
_RESERVED = _MESSAGE_TYPES | {_OBJECT}
_MAX_DEPTH = 200
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")

_Kind = Literal["str", "str_list", "values"]


@dataclass(frozen=True, slots=True)
class _Spec:
    """A built-in type whose data is a dict of the given fields, in this order."""

    fields: tuple[tuple[str, bool, _Kind], ...]  # (name, required, kind)
    build: Callable[..., ContextFragment]


_DICT_SPECS: dict[str, _Spec] = {
    "term": _Spec((("name", True, "str"), ("definition", True, "str")), _f.term),
    "guardrail": _Spec(
        (("rule", True, "str"), ("reason", False, "str"), ("action", False, "str")),
        _f.guardrail,
    ),
    "explain": _Spec(
        (("concept", True, "str"), ("explanation", True, "str"), ("therefore", False, "str")),
        _f.explain,
    ),
    "example": _Spec(
        (("question", True, "str"), ("answer", True, "str"), ("note", False, "str")),
        _f.example,
    ),
    "clarification": _Spec(
        (("when", True, "str"), ("ask", True, "str"), ("reason", True, "str")),
        _f.clarification,
    ),
    "workflow": _Spec(
        (
            ("task", True, "str"),
            ("steps", True, "str_list"),
            ("triggers", False, "str_list"),
            ("notes", False, "str"),
        ),
        _f.workflow,
    ),
    "quirk": _Spec((("issue", True, "str"), ("workaround", True, "str")), _f.quirk),
    "style_guide": _Spec(
        (("prefer", True, "str"), ("never", False, "str"), ("always", False, "str")),
        _f.style_guide,
    ),
    "analogy": _Spec(
        (
            ("concepts", True, "str_list"),
            ("relationship", True, "str"),
            ("insight", False, "str"),
            ("therefore", False, "str"),
            ("pitfall", False, "str"),
        ),
        _f.analogy,
    ),
    "principle": _Spec(
        (("title", True, "str"), ("description", True, "str"), ("policies", False, "values")),
        _f.principle,
    ),
    "policy": _Spec(
        (
            ("rule", True, "str"),
            ("before", False, "str"),
            ("reason", False, "str"),
            ("policies", False, "values"),
        ),
        _f.policy,
    ),
    "identity": _Spec((("name", False, "str"), ("role", False, "str")), _f.identity),
    "persona": _Spec(
        (
            ("name", True, "str"),
            ("role", False, "str"),
            ("objective", False, "str"),
            ("tone", False, "str"),
        ),
        _f.persona,
    ),
    "alias": _Spec((("term", True, "str"), ("meaning", True, "str")), _f.alias),
    "preference": _Spec((("aspect", True, "str"), ("value", True, "str")), _f.preference),
    "correction": _Spec((("subject", True, "str"), ("clarification", True, "str")), _f.correction),
}
_TEXT_SPECS: dict[str, tuple[str, Callable[[str], ContextFragment]]] = {
    "role": ("content", _f.role),
    "hint": ("text", _f.hint),
}
_ALIASES = {"styleGuide": "style_guide"}
_BUILT_IN = frozenset(_DICT_SPECS) | frozenset(_TEXT_SPECS) | {"glossary", "fragment"}

ToFragment = Callable[[dict[str, Any]], ContextFragment]
"""Builds a fragment from its serialized dict."""
FromFragment = Callable[[ContextFragment], "Mapping[str, Any] | None"]
"""Serializes a fragment it recognises, or returns None to let others try."""


class FragmentRegistry:
    """Custom serialized fragment types.

    For example:

    ```python
    registry = FragmentRegistry()
    registry.register(
        "callout",
        to_fragment=lambda s: ContextFragment(name="callout", data=s["text"]),
        from_fragment=lambda f: (
            {"type": "callout", "text": f.data} if f.name == "callout" else None
        ),
    )
    to_fragment({"type": "callout", "text": "Hi"}, registry=registry)
    ```

    ``to_fragment`` receives the serialized dict; ``from_fragment`` receives any fragment
    being serialized and returns its dict, or None when it does not handle it (entries are
    tried in registration order, before the built-ins). A registered type may replace a
    built-in one; the message types and ``$object`` are reserved.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[str, tuple[ToFragment, FromFragment | None]] = {}

    def register(
        self,
        type: str,
        *,
        to_fragment: ToFragment,
        from_fragment: FromFragment | None = None,
    ) -> None:
        """Add (or replace) the custom type ``type``."""
        if not isinstance(type, str) or not type:
            raise SerializationError("a registered fragment type must be a non-empty str")
        if type in _RESERVED:
            raise SerializationError(f"the fragment type {type!r} is reserved")
        if not callable(to_fragment):
            raise SerializationError("to_fragment must be callable")
        if from_fragment is not None and not callable(from_fragment):
            raise SerializationError("from_fragment must be callable or None")
        self._entries[type] = (to_fragment, from_fragment)

    def unregister(self, type: str) -> None:
        """Remove the custom type ``type`` (no error if it is not registered)."""
        self._entries.pop(type, None)

    @property
    def types(self) -> tuple[str, ...]:
        """The registered type names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, type: object) -> bool:
        return type in self._entries

    def _builder(self, type: str) -> ToFragment | None:
        entry = self._entries.get(type)
        return None if entry is None else entry[0]

    def _serialize(self, fragment: ContextFragment) -> Mapping[str, Any] | None:
        for _, serializer in self._entries.values():
            if serializer is not None:
                result = serializer(fragment)
                if result is not None:
                    return result
        return None


# --- from_fragment -------------------------------------------------------------------------


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_str_list(value: object) -> bool:
    return type(value) is list and all(isinstance(item, str) for item in value)


def _match_dict_spec(spec: _Spec, data: object) -> bool:
    if type(data) is not dict:
        return False
    expected = [name for name, required, _ in spec.fields if required or name in data]
    if list(data) != expected:
        return False
    for name, _, kind in spec.fields:
        if name not in data:
            continue
        value = data[name]
        if kind == "str" and not _is_str(value):
            return False
        if kind == "str_list" and not _is_str_list(value):
            return False
        if kind == "values" and type(value) is not list:
            return False
    return True


def _glossary_entries(data: object) -> dict[str, str] | None:
    if type(data) is not list:
        return None
    entries: dict[str, str] = {}
    for item in data:
        if type(item) is not dict or list(item) != ["term", "expression"]:
            return None
        key, value = item["term"], item["expression"]
        if not isinstance(key, str) or not isinstance(value, str) or key in entries:
            return None
        entries[key] = value
    return entries


def _plain(fragment: ContextFragment) -> bool:
    """Whether the fragment has nothing but a name and data (as every builder makes)."""
    return (
        fragment.id is None
        and fragment.type == "fragment"
        and not fragment.persist
        and fragment.codec is None
        and not fragment.metadata
    )


class _Dumper:
    def __init__(self, registry: FragmentRegistry | None) -> None:
        self.registry = registry
        self.active: set[int] = set()

    def fragment(self, fragment: ContextFragment, path: str, depth: int) -> dict[str, Any]:
        if is_message_fragment(fragment):
            raise SerializationError(
                f"{path or fragment.name}: message fragments are not serialized fragments; "
                "save them with ContextEngine.save(), or serialize the message itself with "
                "message_of(fragment).model_dump(mode='json')"
            )
        marker = id(fragment)
        if marker in self.active:
            raise SerializationError(f"{path}: the fragment contains itself")
        self.active.add(marker)
        try:
            return self._fragment(fragment, path or fragment.name, depth)
        finally:
            self.active.discard(marker)

    def _fragment(self, fragment: ContextFragment, path: str, depth: int) -> dict[str, Any]:
        if self.registry is not None:
            custom = self.registry._serialize(fragment)
            if custom is not None:
                return self._checked(custom, path, "the registry's from_fragment")
        if fragment.codec is not None:
            return self._checked(fragment.codec.encode(), path, "the fragment's codec")
        name, data = fragment.name, fragment.data
        if _plain(fragment):
            text_spec = _TEXT_SPECS.get(name)
            if text_spec is not None and isinstance(data, str):
                return {"type": name, text_spec[0]: self.text(data, path)}
            spec = _DICT_SPECS.get(name)
            if spec is not None and _match_dict_spec(spec, data):
                assert isinstance(data, dict)
                out: dict[str, Any] = {"type": name}
                for key, value in data.items():
                    if type(value) is list:
                        out[key] = [
                            self.value(item, f"{path}.{key}[{i}]", depth + 1)
                            for i, item in enumerate(value)
                        ]
                    else:
                        out[key] = self.text(str(value), f"{path}.{key}")
                return out
            if name == "glossary":
                entries = _glossary_entries(data)
                if entries is not None:
                    return {"type": "glossary", "entries": self.json(entries, path, depth)}
        out = {"type": "fragment", "name": name}
        if type(data) is list:
            out["children"] = [
                self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(data)
            ]
        else:
            out["data"] = self.value(data, path, depth + 1)
        if fragment.id is not None:
            out["id"] = fragment.id
        if fragment.persist:
            out["persist"] = True
        if fragment.metadata:
            out["metadata"] = self.json(fragment.metadata, f"{path}.metadata", depth + 1)
        return out

    def _checked(self, value: object, path: str, source: str) -> dict[str, Any]:
        if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
            raise SerializationError(
                f"{path}: {source} must return a dict with a str 'type', not {type(value).__name__}"
            )
        return self.json(dict(value), path, 0)  # type: ignore[no-any-return]

    def text(self, value: str, path: str) -> str:
        if _BAD_TEXT.search(value):
            raise SerializationError(
                f"{path}: strings with NUL characters or lone surrogates cannot be stored as JSON"
            )
        return value

    def number(self, value: float, path: str) -> float:
        if not math.isfinite(value):
            raise SerializationError(f"{path}: {value!r} cannot be stored as JSON")
        return value

    def value(self, value: object, path: str, depth: int) -> Any:
        """A fragment data value as a serialized value."""
        if depth > _MAX_DEPTH:
            raise SerializationError(f"{path}: the value is nested too deeply")
        if isinstance(value, ContextFragment):
            return self.fragment(value, path, depth)
        if type(value) is dict:
            marker = id(value)
            if marker in self.active:
                raise SerializationError(f"{path}: the value contains itself")
            self.active.add(marker)
            try:
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise SerializationError(
                            f"{path}: dict keys must be str, not {type(key).__name__}"
                        )
                    out[self.text(key, path)] = self.value(item, f"{path}.{key}", depth + 1)
            finally:
                self.active.discard(marker)
            if isinstance(out.get("type"), str):
                return {"type": _OBJECT, "value": out}
            return out
        if type(value) in (list, tuple):
            assert isinstance(value, (list, tuple))
            marker = id(value)
            if marker in self.active:
                raise SerializationError(f"{path}: the value contains itself")
            self.active.add(marker)
            try:
                return [self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
            finally:
                self.active.discard(marker)
        return self.scalar(value, path)

    def scalar(self, value: object, path: str) -> Any:
        if value is None or isinstance(value, bool) or type(value) is int:
            return value
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, float):
            return self.number(value, path)
        if isinstance(value, int):
            return int(value)
        raise SerializationError(
            f"{path}: {type(value).__name__} values cannot be serialized"
            + (
                "; lazy data must be materialized first (ContextEngine.resolve())"
                if callable(value) or hasattr(value, "__iter__") or hasattr(value, "__await__")
                else ""
            )
        )

    def json(self, value: object, path: str, depth: int) -> Any:
        """Validate a plain JSON value (metadata, registry output)."""
        if depth > _MAX_DEPTH:
            raise SerializationError(f"{path}: the value is nested too deeply")
        if isinstance(value, Mapping):
            marker = id(value)
            if marker in self.active:
                raise SerializationError(f"{path}: the value contains itself")
            self.active.add(marker)
            try:
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise SerializationError(
                            f"{path}: dict keys must be str, not {type(key).__name__}"
                        )
                    out[self.text(key, path)] = self.json(item, f"{path}.{key}", depth + 1)
                return out
            finally:
                self.active.discard(marker)
        if isinstance(value, (list, tuple)):
            return [self.json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        return self.scalar(value, path)


def from_fragment(
    fragment: ContextFragment, *, registry: FragmentRegistry | None = None
) -> dict[str, Any]:
    """Serialize a non-message fragment to a plain JSON-able dict ``{"type": ..., ...}``.

    Order of precedence: the registry's serializers, then the fragment's codec (its
    ``encode()`` must return a dict with a ``"type"``), then the built-in types, then the
    generic ``fragment`` type.

    Raises:
        SerializationError: for a message fragment, lazy or non-JSON data (NaN, infinities,
            non-str keys, NUL characters, lone surrogates, cycles), or a codec or registry
            entry that does not return a serialized fragment.
    """
    if not isinstance(fragment, ContextFragment):
        raise SerializationError(
            f"from_fragment() takes a ContextFragment, not {type(fragment).__name__}"
        )
    return _Dumper(registry).fragment(fragment, "", 0)


# --- to_fragment ---------------------------------------------------------------------------


class _Loader:
    def __init__(self, registry: FragmentRegistry | None) -> None:
        self.registry = registry

    def fragment(self, serialized: object, path: str, depth: int) -> ContextFragment:
        if depth > _MAX_DEPTH:
            raise SerializationError(f"{path}: the value is nested too deeply")
        if not isinstance(serialized, Mapping):
            raise SerializationError(
                f"{path or 'serialized fragment'}: expected a dict with a 'type', "
                f"not {type(serialized).__name__}"
            )
        kind = serialized.get("type")
        if not isinstance(kind, str):
            raise SerializationError(f"{path or 'serialized fragment'}: 'type' must be a str")
        where = path or kind
        if kind in _MESSAGE_TYPES:
            raise SerializationError(
                f"{where}: message fragments are not serialized fragments; build them with "
                "user(), assistant() or message(Message.model_validate(data))"
            )
        if self.registry is not None:
            custom = self.registry._builder(kind)
            if custom is not None:
                result = custom(dict(serialized))
                if not isinstance(result, ContextFragment):
                    raise SerializationError(
                        f"{where}: the registry's to_fragment for {kind!r} returned "
                        f"{type(result).__name__}, not a ContextFragment"
                    )
                return result
        kind = _ALIASES.get(kind, kind)
        if kind in _TEXT_SPECS:
            field_name, build = _TEXT_SPECS[kind]
            self.keys(serialized, where, required=(field_name,), optional=())
            return build(self.string(serialized[field_name], f"{where}.{field_name}"))
        spec = _DICT_SPECS.get(kind)
        if spec is not None:
            return self.dict_spec(spec, serialized, where, depth)
        if kind == "glossary":
            self.keys(serialized, where, required=("entries",), optional=())
            entries = serialized["entries"]
            if not isinstance(entries, Mapping):
                raise SerializationError(f"{where}.entries: expected a dict of str to str")
            return _f.glossary(
                {
                    self.string(key, f"{where}.entries"): self.string(value, f"{where}.{key}")
                    for key, value in entries.items()
                }
            )
        if kind == "fragment":
            return self.generic(serialized, where, depth)
        known = sorted(_BUILT_IN | set(self.registry.types if self.registry else ()))
        raise SerializationError(
            f"{where}: unknown serialized fragment type {kind!r}; known types: "
            f"{', '.join(known)} (register custom types with a FragmentRegistry)"
        )

    def keys(
        self,
        serialized: Mapping[str, Any],
        where: str,
        *,
        required: tuple[str, ...],
        optional: tuple[str, ...],
    ) -> None:
        allowed = {"type", *required, *optional}
        for key in serialized:
            if key not in allowed:
                raise SerializationError(
                    f"{where}: unexpected field {key!r} (allowed: {', '.join(sorted(allowed))})"
                )
        for key in required:
            if serialized.get(key) is None:
                raise SerializationError(f"{where}: missing required field {key!r}")

    def string(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise SerializationError(f"{where}: expected a str, not {type(value).__name__}")
        return value

    def dict_spec(
        self, spec: _Spec, serialized: Mapping[str, Any], where: str, depth: int
    ) -> ContextFragment:
        required = tuple(name for name, req, _ in spec.fields if req)
        optional = tuple(name for name, req, _ in spec.fields if not req)
        self.keys(serialized, where, required=required, optional=optional)
        kwargs: dict[str, Any] = {}
        for name, _, kind in spec.fields:
            value = serialized.get(name)
            if value is None:
                continue
            if kind == "str":
                kwargs[name] = self.string(value, f"{where}.{name}")
            elif kind == "str_list":
                if not isinstance(value, list):
                    raise SerializationError(f"{where}.{name}: expected a list of str")
                kwargs[name] = [self.string(item, f"{where}.{name}") for item in value]
            else:
                if not isinstance(value, list):
                    raise SerializationError(f"{where}.{name}: expected a list")
                kwargs[name] = [
                    self.value(item, f"{where}.{name}[{i}]", depth + 1)
                    for i, item in enumerate(value)
                ]
        return spec.build(**kwargs)

    def generic(self, serialized: Mapping[str, Any], where: str, depth: int) -> ContextFragment:
        self.keys(
            serialized,
            where,
            required=("name",),
            optional=("children", "data", "id", "persist", "metadata"),
        )
        name = self.string(serialized["name"], f"{where}.name")
        where = f"{where}({name})" if where == "fragment" else where
        if "children" in serialized and "data" in serialized:
            raise SerializationError(f"{where}: give either 'children' or 'data', not both")
        data: FragmentData
        if "children" in serialized:
            children = serialized["children"]
            if not isinstance(children, list):
                raise SerializationError(f"{where}.children: expected a list")
            data = [self.value(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(children)]
        else:
            data = self.value(serialized.get("data"), where, depth + 1)
        fragment_id = serialized.get("id")
        if fragment_id is not None and not isinstance(fragment_id, str):
            raise SerializationError(f"{where}.id: expected a str")
        persist = serialized.get("persist", False)
        if not isinstance(persist, bool):
            raise SerializationError(f"{where}.persist: expected a bool")
        metadata = serialized.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise SerializationError(f"{where}.metadata: expected a dict")
        return ContextFragment(
            name=name, data=data, id=fragment_id, persist=persist, metadata=dict(metadata)
        )

    def value(self, value: object, where: str, depth: int) -> FragmentData:
        if depth > _MAX_DEPTH:
            raise SerializationError(f"{where}: the value is nested too deeply")
        if isinstance(value, Mapping):
            kind = value.get("type")
            if kind == _OBJECT:
                inner = value.get("value")
                if set(value) != {"type", "value"} or not isinstance(inner, Mapping):
                    raise SerializationError(
                        f"{where}: '$object' needs exactly a 'value' dict next to 'type'"
                    )
                return self.plain_dict(inner, where, depth)
            if isinstance(kind, str):
                return self.fragment(value, where, depth + 1)
            return self.plain_dict(value, where, depth)
        if isinstance(value, list):
            return [self.value(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise SerializationError(f"{where}: {value!r} is not a JSON number")
            return value
        raise SerializationError(f"{where}: {type(value).__name__} is not a JSON value")

    def plain_dict(self, value: Mapping[Any, Any], where: str, depth: int) -> FragmentData:
        out: dict[str, FragmentData] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SerializationError(f"{where}: dict keys must be str")
            out[key] = self.value(item, f"{where}.{key}", depth + 1)
        return out


def to_fragment(
    serialized: Mapping[str, Any], *, registry: FragmentRegistry | None = None
) -> ContextFragment:
    """Build the fragment a serialized dict describes (see the module docs for the types).

    A type registered in ``registry`` takes precedence over a built-in one.

    Raises:
        SerializationError: for a message type, an unknown type, a missing required field,
            an unexpected field, or a value of the wrong type.
    """
    return _Loader(registry).fragment(serialized, "", 0)
