"""Which field a rejected body got wrong, said the way OpenAI's errors say it.

Pydantic reports one error per branch of every union a value failed, in declaration order, and
puts each branch's label in the location (``str``, ``list[...]``, a model's class name). The
first error is then often the least useful: a content part with a bad ``input_audio.format``
is first reported as "content: Input should be a valid string". So the error a client hears is
the one that reached deepest into what was sent, and its location is written without the
branch labels: ``messages[0].content[0].input_audio.format``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Labels pydantic gives the branches of a union of plain types; the API's own field names are
# lowercase snake_case words and never one of these.
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "bytes", "dict", "list", "none"})


def _is_branch_label(part: str) -> bool:
    return "[" in part or part[:1].isupper() or part in _TYPE_LABELS


def field_path(loc: Sequence[int | str]) -> str:
    """``("messages", 0, "content", "list[...]", 0, "AudioPart", "input_audio", "format")``
    as ``messages[0].content[0].input_audio.format``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _is_branch_label(part):
            path += f".{part}" if path else part
    return path


def _depth(error: dict[str, Any]) -> int:
    return sum(1 for p in error["loc"] if isinstance(p, int) or not _is_branch_label(p))


@dataclass(frozen=True)
class FieldError:
    param: str | None  # None: the error is about the whole body
    reason: str

    @property
    def message(self) -> str:
        return f"{self.param}: {self.reason}" if self.param else self.reason

    def under(self, prefix: str) -> FieldError:
        """The same error for a body that sits at ``prefix`` in what the client sent."""
        return FieldError(f"{prefix}.{self.param}" if self.param else prefix, self.reason)


def most_specific(errors: Sequence[dict[str, Any]], skip: int = 0) -> FieldError:
    """The error that names the deepest field; the first of those on a tie. ``skip`` leaves out
    leading location parts the client did not write (FastAPI's ``body``, a Realtime event's
    type tag)."""
    if not errors:
        return FieldError(None, "invalid request")
    best = max(errors, key=_depth)  # max keeps the first of equals
    # A validator's ValueError reads "Value error, <its message>": the message is the reason.
    reason = best["msg"].removeprefix("Value error, ")
    return FieldError(field_path(best["loc"][skip:]) or None, reason)
