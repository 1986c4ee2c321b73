"""Renderers turn system-prompt fragments into text: XML, Markdown, TOML or TOON.

All renderers are synchronous and pure, share the same normalisation rules
(`agentcontext.renderers.base`) and always produce well-formed output in their format.
"""

from __future__ import annotations

from agentcontext.renderers.base import ContextRenderer, plural, singular
from agentcontext.renderers.markdown import MarkdownRenderer
from agentcontext.renderers.toml import TomlRenderer
from agentcontext.renderers.toon import ToonRenderer
from agentcontext.renderers.xml import XmlRenderer

__all__ = [
    "ContextRenderer",
    "MarkdownRenderer",
    "TomlRenderer",
    "ToonRenderer",
    "XmlRenderer",
    "plural",
    "singular",
]
