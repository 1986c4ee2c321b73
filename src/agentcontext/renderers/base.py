"""The renderer interface and the helpers every renderer shares.

A renderer turns the system-prompt fragments into one string. Renderers are synchronous and
pure: the same fragments always give the same text, and nothing is changed.

Before rendering, every renderer *normalises* the fragments the same way
(`normalize_fragments`):

* a fragment with a codec contributes ``codec.decode()``, never its (possibly stale) ``data``;
* ``None`` values are dropped from dicts and lists, and a fragment whose data is ``None`` is
  dropped (a top-level one renders nothing);
* tuples are treated as lists;
* lone surrogates (which no text encoding can carry) become U+FFFD;
* lazy values (callables, awaitables, generators, sets, ...) are refused with an
  `InvalidInputError` telling to resolve through the engine,
  other values that are not fragment data are refused with an
  `InvalidTypeError`, both naming where the value is;
* message fragments are refused: they are the conversation, not the system prompt.

Singular and plural forms of tag names come from one pair of functions, `singular`
and `plural` (see their docs for the rules).
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, TypeAlias

from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.fragments import ContextFragment
from agentcontext.lazy import is_lazy_value

__all__ = [
    "ContextRenderer",
    "Group",
    "Node",
    "Value",
    "format_scalar",
    "group_by_name",
    "normalize_fragments",
    "plural",
    "singular",
    "title_case",
]

_MAX_DEPTH = 200
_SURROGATES = re.compile("[\ud800-\udfff]")


class Node:
    """A normalised fragment: a name and a value that holds no ``None`` and nothing lazy."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Value) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.value!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Node):
            return self.name == other.name and self.value == other.value
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


Value: TypeAlias = "str | int | float | bool | Node | list[Value] | dict[str, Value]"
"""A normalised value."""


# --- normalisation -------------------------------------------------------------------------


class _Bad(Exception):
    """A value that cannot be rendered; the path is filled in while unwinding."""

    def __init__(self, message: str, error: type[InvalidInputError]) -> None:
        super().__init__(message)
        self.message = message
        self.error = error
        self.parts: list[str] = []


def _clean_text(text: str) -> str:
    if text.isascii() or not _SURROGATES.search(text):
        return text
    return _SURROGATES.sub("\ufffd", text)


class _Normalizer:
    """Walks fragment data once; cycles are caught by the depth bound."""

    __slots__ = ()

    def fragment(self, fragment: ContextFragment, depth: int) -> Node | None:
        if fragment.type == "message":
            raise _Bad(
                "message fragments are the conversation, not system-prompt content; "
                "pass them to ContextEngine.set() instead of rendering them",
                InvalidInputError,
            )
        try:
            data = fragment.codec.decode() if fragment.codec is not None else fragment.data
            value = self.value(data, depth + 1)
        except _Bad as bad:
            bad.parts.append(fragment.name)
            raise
        if value is None:
            return None
        name = fragment.name
        return Node(name if name.isascii() else _clean_text(name), value)

    def value(self, value: Any, depth: int) -> Value | None:
        kind = type(value)
        if kind is str:
            return value if value.isascii() else _clean_text(value)
        if kind is int or kind is float or kind is bool:
            return value  # type: ignore[no-any-return]
        if value is None:
            return None
        if depth > _MAX_DEPTH:
            raise _Bad(
                f"the data is nested deeper than {_MAX_DEPTH} levels, or contains itself",
                InvalidInputError,
            )
        if kind is dict or kind is list or kind is tuple:
            return self.container(value, depth)
        if kind is ContextFragment:
            return self.fragment(value, depth)
        return self.other(value, depth)

    def container(self, value: Any, depth: int) -> Value:
        inner = depth + 1
        if isinstance(value, dict):
            out: dict[str, Value] = {}
            for key, item in value.items():
                if type(key) is not str:
                    raise _Bad(
                        f"dict keys must be str, not {type(key).__name__} ({key!r})",
                        InvalidTypeError,
                    )
                kind = type(item)
                if kind is str:
                    normalized = item if item.isascii() else _clean_text(item)
                elif kind is int or kind is float or kind is bool:
                    normalized = item
                elif item is None:
                    continue
                else:
                    try:
                        normalized = self.value(item, inner)
                    except _Bad as bad:
                        bad.parts.append(f"[{key!r}]")
                        raise
                    if normalized is None:
                        continue
                out[key if key.isascii() else _clean_text(key)] = normalized
            return out
        items: list[Value] = []
        for index, item in enumerate(value):
            kind = type(item)
            if kind is str:
                items.append(item if item.isascii() else _clean_text(item))
            elif kind is int or kind is float or kind is bool:
                items.append(item)
            elif item is not None:
                try:
                    normalized = self.value(item, inner)
                except _Bad as bad:
                    bad.parts.append(f"[{index}]")
                    raise
                if normalized is not None:
                    items.append(normalized)
        return items

    def other(self, value: Any, depth: int) -> Value | None:
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, str):
            return _clean_text(str(value))
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, (dict, list, tuple)):
            return self.container(value, depth)
        if isinstance(value, ContextFragment):
            return self.fragment(value, depth)
        if is_lazy_value(value):
            raise _Bad(
                f"lazy value ({type(value).__name__}) reached the renderer; lazy data is "
                "materialised by the engine: render through ContextEngine.resolve(), or "
                "await LazyResolver().materialize(fragments) first",
                InvalidInputError,
            )
        raise _Bad(
            f"{type(value).__name__} is not fragment data (use str, int, float, bool, None, "
            "a ContextFragment, or a list or str-keyed dict of these)",
            InvalidTypeError,
        )


def normalize_fragments(fragments: Sequence[ContextFragment]) -> list[Node]:
    """Normalise top-level fragments for rendering (see the module docs for the rules).

    Raises:
        InvalidInputError: a lazy value, a message fragment, or data that contains itself.
        InvalidTypeError: a value that is not fragment data, or a dict key that is not a str.
    """
    normalizer = _Normalizer()
    nodes: list[Node] = []
    for index, fragment in enumerate(fragments):
        if not isinstance(fragment, ContextFragment):
            raise InvalidTypeError(
                f"fragments[{index}] is a {type(fragment).__name__}, not a ContextFragment"
            )
        try:
            node = normalizer.fragment(fragment, 0)
        except _Bad as bad:
            path = _format_path(bad.parts)
            raise bad.error(f"cannot render {path}: {bad.message}") from None
        if node is not None:
            nodes.append(node)
    return nodes


def _format_path(parts: list[str]) -> str:
    """``["[1]", "['list']", "tables", "[0]", "database"]`` (innermost first) →
    ``fragment 'database.tables' at data['list'][1]``: fragment names joined by dots, then
    where in the last fragment's data the value is."""
    outer_first = parts[::-1]
    last_name = max(
        (i for i, part in enumerate(outer_first) if not part.startswith("[")), default=-1
    )
    names = ".".join(part for part in outer_first[: last_name + 1] if not part.startswith("["))
    where = "".join(outer_first[last_name + 1 :])
    text = f"fragment {names!r}" if names else "fragment"
    return f"{text} at data{where}" if where else text


# --- shared formatting ---------------------------------------------------------------------


def format_scalar(value: str | int | float | bool) -> str:
    """A scalar as text: ``true``/``false``, integers as digits, floats by ``repr``.

    Non-finite floats are written ``NaN``, ``Infinity`` and ``-Infinity``. Never a Python
    repr of a container, ``True`` or ``None``.
    """
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is str:
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return str(value)


class Group:
    """Same-named sibling fragments gathered by `group_by_name`."""

    __slots__ = ("name", "nodes")

    def __init__(self, name: str, nodes: list[Node]) -> None:
        self.name = name
        self.nodes = nodes


def group_by_name(items: Sequence[Value]) -> list[Value | Group]:
    """Group the fragments of a list by name, for ``group_fragments=True``.

    Each name's `Group` takes the place of its first fragment; other items keep
    their place, so the order of first appearances is kept.
    """
    slots: list[Value | Group] = []
    groups: dict[str, Group] = {}
    for item in items:
        if isinstance(item, Node):
            group = groups.get(item.name)
            if group is None:
                group = groups[item.name] = Group(item.name, [item])
                slots.append(group)
            else:
                group.nodes.append(item)
        else:
            slots.append(item)
    return slots


# --- singular and plural -------------------------------------------------------------------

# Words whose singular is themselves although they end in "s" (or that have no singular).
_SAME_SINGULAR = frozenset(
    [
        "always",
        "analysis",
        "news",
        "series",
        "species",
        "status",
        "bus",
        "virus",
        "bonus",
        "campus",
        "focus",
        "corpus",
        "census",
        "alias",
        "canvas",
        "atlas",
        "bias",
        "gas",
        "lens",
        "chaos",
        "ethos",
        "thesis",
        "crisis",
        "diagnosis",
        "hypothesis",
        "synopsis",
        "emphasis",
        "basis",
        "axis",
        "means",
        "physics",
        "mathematics",
        "economics",
        "politics",
        "ethics",
        "logistics",
        "athletics",
        "gymnastics",
        "this",
        "yes",
        "is",
        "was",
        "has",
        "does",
        "process",
        "access",
        "address",
        "business",
        "class",
    ]
)
# Words whose plural is themselves.
_SAME_PLURAL = frozenset(
    [
        "series",
        "species",
        "news",
        "data",
        "metadata",
        "information",
        "equipment",
        "feedback",
        "knowledge",
        "advice",
        "research",
        "progress",
        "evidence",
        "guidance",
        "software",
        "hardware",
        "firmware",
        "middleware",
        "sheep",
        "fish",
        "deer",
        "moose",
        "aircraft",
        "music",
        "money",
        "traffic",
        "weather",
        "homework",
        "luggage",
        "baggage",
        "furniture",
        "staff",
        "police",
    ]
)
# Irregular singular -> plural pairs.
_IRREGULAR = {
    "person": "people",
    "man": "men",
    "woman": "women",
    "child": "children",
    "mouse": "mice",
    "goose": "geese",
    "foot": "feet",
    "tooth": "teeth",
    "ox": "oxen",
    "criterion": "criteria",
    "phenomenon": "phenomena",
    "matrix": "matrices",
    "vertex": "vertices",
    "appendix": "appendices",
    "quiz": "quizzes",
    "leaf": "leaves",
    "life": "lives",
    "knife": "knives",
    "wife": "wives",
    "wolf": "wolves",
    "half": "halves",
    "shelf": "shelves",
    "self": "selves",
    "thief": "thieves",
    "calf": "calves",
    "loaf": "loaves",
    "elf": "elves",
    "scarf": "scarves",
    "hero": "heroes",
    "potato": "potatoes",
    "tomato": "tomatoes",
    "echo": "echoes",
    "veto": "vetoes",
    "torpedo": "torpedoes",
    "movie": "movies",
    "cookie": "cookies",
    "zombie": "zombies",
    "calorie": "calories",
    "rookie": "rookies",
    "cache": "caches",
    "niche": "niches",
    "headache": "headaches",
    "avalanche": "avalanches",
    "axis": "axes",
    "status": "statuses",
    "bus": "buses",
    "virus": "viruses",
    "bonus": "bonuses",
    "campus": "campuses",
    "census": "censuses",
    "focus": "focuses",
    "alias": "aliases",
    "canvas": "canvases",
    "atlas": "atlases",
    "bias": "biases",
    "gas": "gases",
    "lens": "lenses",
    "analysis": "analyses",
    "diagnosis": "diagnoses",
    "hypothesis": "hypotheses",
    "thesis": "theses",
    "crisis": "crises",
    "synopsis": "synopses",
    "emphasis": "emphases",
    "parenthesis": "parentheses",
    "ellipsis": "ellipses",
    "synthesis": "syntheses",
}
_IRREGULAR_SINGULAR = {plural_: single for single, plural_ in _IRREGULAR.items()}
_LAST_WORD = re.compile(r"(?:[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+)$")


def _split_last_word(name: str) -> tuple[str, str]:
    """Split ``name`` into a prefix and its last English word.

    ``tool_calls`` → (``tool_``, ``calls``), ``userQueries`` → (``user``, ``Queries``). A name
    that does not end in an ASCII word (``名前``, ``países``) has no last word.
    """
    match = _LAST_WORD.search(name)
    if match is None:
        return name, ""
    start = match.start()
    if start and name[start].islower() and name[start - 1].isalpha():
        return name, ""  # the ASCII letters end a non-ASCII word
    return name[:start], match.group()


def _with_case(word: str, replacement: str) -> str:
    """``replacement`` (lower case) written in the case of ``word``."""
    if word.isupper() and len(word) > 1:
        return replacement.upper()
    if word[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _singular_word(word: str) -> str:
    lower = word.lower()
    if lower in _SAME_SINGULAR or lower in _SAME_PLURAL or lower in _IRREGULAR:
        return word
    if lower in _IRREGULAR_SINGULAR:
        return _with_case(word, _IRREGULAR_SINGULAR[lower])
    if lower.endswith("ies") and len(lower) > 4:
        return word[:-3] + _with_case(word[-3:], "y")
    if lower.endswith(("sses", "shes", "ches", "xes", "zzes")):
        return word[:-2]
    if lower.endswith(("ss", "us", "is")):
        return word
    if lower.endswith("s") and len(lower) > 1:
        return word[:-1]
    return word


def _plural_word(word: str) -> str:
    lower = word.lower()
    if lower in _SAME_PLURAL or lower in _IRREGULAR_SINGULAR:
        return word
    if lower in _IRREGULAR:
        return _with_case(word, _IRREGULAR[lower])
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return word[:-1] + _with_case(word[-1], "ies")
    if lower.endswith(("s", "sh", "ch", "x", "z")):
        return word + _with_case(word[-1], "es")
    return word + _with_case(word[-1], "s")


def singular(name: str) -> str:
    """The singular of a (plural) name, used for the items of a list.

    The rule works on the last word of the name (``tool_calls`` → ``tool_call``,
    ``userQueries`` → ``userQuery``) and keeps its case:

    * words with no different singular stay as they are: ``status``, ``series``, ``news``,
      ``data``, ``analysis``, ``always``, ... and words ending in ``ss``, ``us`` or ``is``;
    * irregular plurals: ``people`` → ``person``, ``children`` → ``child``,
      ``criteria`` → ``criterion``, ``statuses`` → ``status``, ``leaves`` → ``leaf``,
      ``analyses`` → ``analysis``, ...;
    * ``-ies`` → ``-y`` (``queries`` → ``query``, ``categories`` → ``category``,
      ``policies`` → ``policy``);
    * ``-sses``, ``-shes``, ``-ches``, ``-xes``, ``-zzes`` lose ``es`` (``classes`` →
      ``class``, ``matches`` → ``match``, ``boxes`` → ``box``);
    * otherwise a final ``s`` is dropped (``steps`` → ``step``, ``rules`` → ``rule``);
    * a name that is already singular stays as it is (``hint`` → ``hint``).
    """
    prefix, word = _split_last_word(name)
    if not word:
        return name
    return prefix + _singular_word(word)


def plural(name: str) -> str:
    """The plural of a name, used for the group tag of ``group_fragments=True``.

    The inverse of `singular` on its last word: irregular plurals (``person`` →
    ``people``, ``status`` → ``statuses``, ``analysis`` → ``analyses``), words with no
    plural form (``data``, ``news``, ``feedback``), consonant + ``y`` → ``ies``
    (``query`` → ``queries``), ``-s``, ``-sh``, ``-ch``, ``-x``, ``-z`` → ``+es``, and
    ``+s`` otherwise (``hint`` → ``hints``).
    """
    prefix, word = _split_last_word(name)
    if not word:
        return name
    return prefix + _plural_word(word)


_WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def title_case(name: str) -> str:
    """A name as a heading: ``style_guide`` → ``Style Guide``, ``userAPIKey`` → ``User API Key``."""
    words = _WORD_BREAK.sub(" ", name.replace("_", " ").replace("-", " ")).split()
    return " ".join(word[:1].upper() + word[1:] for word in words)


# --- the interface -------------------------------------------------------------------------


class ContextRenderer(ABC):
    """Turns system-prompt fragments into text.

    Subclasses implement `render`; they usually call `normalize_fragments`
    first and then walk the normalised `Node` tree.
    """

    @abstractmethod
    def render(self, fragments: Sequence[ContextFragment]) -> str:
        """Render the fragments, in order, to one string."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
