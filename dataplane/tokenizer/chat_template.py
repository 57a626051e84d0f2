"""Chat templates rendered like HF transformers' `apply_chat_template`, with jinja2 only.

Same environment as transformers: sandboxed (templates from model repos are untrusted),
`trim_blocks` and `lstrip_blocks`, the loop-controls extension, a `{% generation %}` block
(rendered as its body), the `tojson` filter without HTML escaping, and the globals
`raise_exception(msg)` and `strftime_now(fmt)`. Variables: `messages`, `tools`, `documents`,
`add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, ...) and any extra
keyword arguments.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dataplane.core import EngineError


class ChatTemplateError(EngineError):
    """The template is missing, does not compile, or raised while rendering."""

    code = "CHAT_TEMPLATE_ERROR"


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text; rendered verbatim."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def render_chat_template(
    source: str,
    messages: list[Mapping[str, Any]],
    *,
    special_tokens: Mapping[str, str],
    add_generation_prompt: bool = False,
    tools: list[Mapping[str, Any]] | None = None,
    documents: list[Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    """Render `messages` (dicts with at least `role`) to the prompt string."""
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise ChatTemplateError("messages must be a list of mappings")
    template = compile_chat_template(source)
    try:
        return template.render(
            messages=[dict(m) for m in messages], tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt, **{**special_tokens, **kwargs},
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
