"""A model folder's chat template, compiled and rendered by vitreg in Jinja's immutable sandbox
with a budget: a template is code from the folder, so attribute tricks (``__class__``) are
blocked by the sandbox, and loops, calls, output and time are counted, so a template that would
run for minutes or fill memory stops at the budget. Every failure is an :class:`InputError`
naming the file and what the template did."""

from __future__ import annotations

import time
from typing import Any

from vitreg.errors import InputError

MAX_OUTPUT = 64 * 1024  # characters a rendered prompt may have
MAX_STEPS = 1_000_000  # calls, lookups, loop items and output chunks in one rendering
MAX_SECONDS = 5.0  # one rendering


class _Budget(Exception):
    """A template ran past its budget."""


def _sandbox() -> Any:
    """An immutable Jinja sandbox (transformers' settings) that counts what a template does."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Budgeted(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def __init__(self) -> None:
            super().__init__(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            self.steps, self.deadline = 0, time.monotonic() + MAX_SECONDS
            self.globals["range"] = self._range
            self.globals["raise_exception"] = _raise
            self.filters = {name: self._counted(f) for name, f in self.filters.items()}

        def tick(self, n: int = 1) -> None:
            self.steps += n
            if self.steps > MAX_STEPS:
                raise _Budget(f"more than {MAX_STEPS:,} steps (loops, calls, lookups)")
            if time.monotonic() > self.deadline:
                raise _Budget(f"more than {MAX_SECONDS:g} s")

        def _range(self, *args: Any) -> range:
            r = range(*args)
            self.tick(len(r))
            return r

        def _counted(self, f: Any) -> Any:
            def filtered(*args: Any, **kwargs: Any) -> Any:
                self.tick()
                return _sized(f(*args, **kwargs))

            for attr in ("jinja_pass_arg",):  # keep how Jinja passes context/environment
                if hasattr(f, attr):
                    setattr(filtered, attr, getattr(f, attr))
            return filtered

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            __self.tick()
            return _sized(super().call(__context, __obj, *args, **kwargs))

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            """Refuse at once (the sandbox would return an undefined that prints as '')."""
            from jinja2.exceptions import SecurityError

            raise SecurityError(
                f"access to attribute {str(attribute)[:40]!r} of a {type(obj).__name__} is unsafe"
            )

        def getattr(self, obj: Any, attribute: str) -> Any:
            self.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            self.tick()
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            self.tick()
            if operator == "**" and isinstance(right, int) and abs(right) > 64:
                raise _Budget(f"a power of {right}")
            if operator == "*" and isinstance(left, str | list | tuple) and isinstance(right, int):
                _sized_len(len(left) * right)
            if operator == "*" and isinstance(right, str | list | tuple) and isinstance(left, int):
                _sized_len(len(right) * left)
            return _sized(super().call_binop(context, operator, left, right))

    return Budgeted()


def _raise(message: Any) -> None:
    """``raise_exception(msg)``, which chat templates call to refuse a conversation."""
    from jinja2 import TemplateError

    raise TemplateError(str(message)[:200])


def _sized_len(n: int) -> None:
    if n > MAX_OUTPUT:
        raise _Budget(f"a value of {n:,} items or characters (at most {MAX_OUTPUT:,})")


def _sized(value: Any) -> Any:
    if isinstance(value, str | list | tuple | dict):
        _sized_len(len(value))
    return value


def _named(e: BaseException, where: str) -> InputError:
    """The error of a template that failed: what it did, in one line."""
    from jinja2 import TemplateSyntaxError
    from jinja2.exceptions import SecurityError

    if isinstance(e, TemplateSyntaxError):
        return InputError(
            f"{where}: the chat template is not valid Jinja (line {e.lineno}: "
            f"{str(e.message)[:200]}); fix or remove it"
        )
    if isinstance(e, SecurityError):
        return InputError(
            f"{where}: the chat template tried something Jinja's sandbox blocks "
            f"({str(e)[:200]}); vitreg renders templates sandboxed, so this template cannot be used"
        )
    if isinstance(e, _Budget):
        return InputError(
            f"{where}: the chat template ran past vitreg's budget ({e}); a chat template formats "
            "one conversation, so this one is broken or hostile"
        )
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return InputError(f"{where}: the chat template failed ({type(e).__name__}: {first})")


def compile_template(text: str, where: str) -> Any:
    """The compiled template, or an :class:`InputError` naming ``where``."""
    if not isinstance(text, str):
        raise InputError(f"{where}: the chat template is a {type(text).__name__}, not text")
    if len(text) > MAX_OUTPUT:
        raise InputError(
            f"{where}: the chat template has {len(text):,} characters, above {MAX_OUTPUT:,}"
        )
    try:
        return _sandbox().from_string(text)
    except Exception as e:
        raise _named(e, where) from None


def render_chat_template(text: str, where: str, **variables: Any) -> str:
    """``text`` rendered with ``variables`` in the budgeted sandbox."""
    template = compile_template(text, where)
    env, out, size = template.environment, [], 0
    env.deadline = time.monotonic() + MAX_SECONDS
    try:
        for chunk in template.generate(**variables):
            env.tick()
            size += len(chunk)
            _sized_len(size)
            out.append(chunk)
    except (Exception, RecursionError, MemoryError) as e:
        raise _named(e, where) from None
    return "".join(out)
