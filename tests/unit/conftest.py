"""Helpers for the renderer tests: real parsers and independent oracles of the rendered data.

The oracles compute, straight from the fragments, the data each format must give back when
its output is parsed; they do not use the renderers' own code.
"""

from __future__ import annotations

import math
import re
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import toon_format

from agentcontext.fragments import ContextFragment

_DROP = object()
_SURROGATES = re.compile("[\ud800-\udfff]")
INT64 = (-(2**63), 2**63 - 1)


def parse_xml(text: str) -> ET.Element:
    """Parse renderer output (several top-level elements) inside a wrapper element."""
    return ET.fromstring(f"<root>{text}</root>")


def parse_toml(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


def parse_toon(text: str) -> Any:
    return toon_format.decode(text)


def _text(value: str) -> str:
    return _SURROGATES.sub("\ufffd", value)


def _data_of(fragment: ContextFragment) -> Any:
    return fragment.codec.decode() if fragment.codec is not None else fragment.data


def _plain(value: Any, *, toml: bool) -> Any:
    """A value in the JSON model (fragments as one-key dicts), ``_DROP`` for None."""
    if value is None:
        return _DROP
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if toml and not INT64[0] <= value <= INT64[1]:
            return str(value)
        return value
    if isinstance(value, float):
        if not toml and not math.isfinite(value):
            return None  # TOON has no NaN or infinities
        return value
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, ContextFragment):
        inner = _plain(_data_of(value), toml=toml)
        if inner is _DROP:
            return _DROP
        return {_text(value.name): inner}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            converted = _plain(item, toml=toml)
            if converted is not _DROP:
                out[_text(key)] = converted
        return out
    if isinstance(value, (list, tuple)):
        kept = [item for item in value if _plain(item, toml=toml) is not _DROP]
        if toml and kept and all(isinstance(item, ContextFragment) for item in kept):
            return _merge(kept, toml=True)
        return [_plain(item, toml=toml) for item in kept]
    raise TypeError(type(value))


def _merge(fragments: Sequence[ContextFragment], *, toml: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for fragment in fragments:
        value = _plain(_data_of(fragment), toml=toml)
        if value is _DROP:
            continue
        name = _text(fragment.name)
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == 1:
            out[name] = value
        elif counts[name] == 2:
            out[name] = [out[name], value]
        else:
            out[name].append(value)
    return out


def expected_toon(fragments: Sequence[ContextFragment]) -> dict[str, Any]:
    """What ``toon_format.decode`` must give back for ``ToonRenderer().render(fragments)``."""
    return _merge(fragments, toml=False)


def expected_toml(fragments: Sequence[ContextFragment]) -> dict[str, Any]:
    """What ``tomllib.loads`` must give back for ``TomlRenderer().render(fragments)``."""
    return _merge(fragments, toml=True)


def renders_xml_element(value: Any) -> bool:
    """Whether a value renders at least one XML element (empty containers render nothing)."""
    if value is None:
        return False
    if isinstance(value, ContextFragment):
        return renders_xml_element(_data_of(value))
    if isinstance(value, dict):
        return any(renders_xml_element(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(renders_xml_element(item) for item in value)
    return True


def scalar_texts(value: Any) -> list[str]:
    """Every string of a value (keys excluded), in order."""
    if isinstance(value, ContextFragment):
        return scalar_texts(_data_of(value))
    if isinstance(value, dict):
        return [text for item in value.values() for text in scalar_texts(item)]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in scalar_texts(item)]
    if isinstance(value, str):
        return [value]
    return []
