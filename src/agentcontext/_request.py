"""What a model is sent: the system prompt, and the conversation (the branch's chain with the
pending messages merged in) fitted into a context window when one is given; and the offline
estimate of it."""

from __future__ import annotations

from collections.abc import Sequence

from agentcontext import _validate as v
from agentcontext._chainview import ChainView
from agentcontext._pending import PendingQueue
from agentcontext._window import ContextWindow, fit
from agentcontext.errors import InvalidInputError, InvalidTypeError
from agentcontext.estimate import Estimate, estimate_context
from agentcontext.fragments import ContextFragment
from agentcontext.lazy import has_lazy_value
from agentcontext.messages import ResolveResult
from agentcontext.renderers import ContextRenderer, XmlRenderer

__all__ = ["assemble", "check_renderer", "estimate", "render_loaded"]


def check_renderer(renderer: object) -> ContextRenderer:
    """``renderer``, or `XmlRenderer` for None."""
    if renderer is None:
        return XmlRenderer()
    if not isinstance(renderer, ContextRenderer):
        raise InvalidTypeError(
            f"renderer must be a ContextRenderer (XmlRenderer(), MarkdownRenderer(), ...), "
            f"got {v.type_name(renderer)}"
        )
    return renderer


def render_loaded(renderer: ContextRenderer, fragments: Sequence[ContextFragment]) -> str:
    """The system prompt of ``fragments``, none of which may hold lazy data (only the async
    calls load it)."""
    for fragment in fragments:
        if has_lazy_value(fragment):
            raise InvalidInputError(
                f"fragment {fragment.name!r} holds lazy data, which render() cannot load; "
                "use (await engine.resolve()).system_prompt instead"
            )
    return renderer.render(fragments)


def assemble(
    system_prompt: str, chain: ChainView, pending: PendingQueue, window: ContextWindow | None
) -> ResolveResult:
    """The request: the conversation composed, then fitted into ``window`` (whole oldest
    turns left out; the compaction's summary always stays)."""
    messages = pending.compose(chain)
    omitted: list[str] = []
    estimated: int | None = None
    if window is not None:
        summary = chain.summary
        fitted = fit(
            window,
            system_prompt,
            messages,
            keep=() if summary is None else (summary.id,),
            raw=chain.raw_texts(),
        )
        messages, omitted, estimated = fitted.messages, fitted.omitted, fitted.tokens
    return ResolveResult.model_construct(
        system_prompt=system_prompt,
        messages=messages,
        record_id=None,
        omitted=omitted,
        estimate=estimated,
    )


def estimate(
    model_id: str,
    renderer: ContextRenderer,
    fragments: Sequence[ContextFragment],
    chain: ChainView,
    pending: PendingQueue,
) -> Estimate:
    """Tokens, cost and fit of the request, offline (``fragments`` materialised)."""
    return estimate_context(
        model_id,
        system_prompt=renderer.render(fragments),
        fragments=[(fragment.name, renderer.render([fragment])) for fragment in fragments],
        messages=pending.compose(chain),
    )
