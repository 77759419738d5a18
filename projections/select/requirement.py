"""Whole LSF resource requirement strings (what users give `bsub -R`): find the select section.

LSF's simple requirement string is made of sections, each `name[...]`:
`select`, `order`, `rusage`, `span`, `same`, `cu` and `affinity`
(IBM Spectrum LSF, "Resource requirement strings").  crr evaluates the
`select` section only; the others are the scheduler's and are returned,
as written, in `Requirement.ignored`, so callers can say so.

Accepted, as LSF does:

- sections in any order, with or without spaces before `[`
  (`select [ … ]`, as IBM's own examples write it);
- the shorthand where leading text with no section keyword is the select
  section (`swp > 15 && hpux order[ut]`); it must come first;
- anything inside the other sections: nested brackets and parentheses
  (`rusage[mem=(100):duration=10]`, `affinity[core(2,same=socket)*4]`),
  `,` and `||` alternatives inside `rusage[...]`, quoted strings holding
  `]`; also `rusage[…] || rusage[…]` (the older alternative form).

Errors (an ExpressionError with the column of the offending text):

- an unknown section name (`rusge[mem=1]`), with the closest known name;
- a second select section (LSF refuses it too; join the conditions with `&&`);
- compound and alternative requirements (`2*{select[…]} + 4*{…}`,
  `{…} || {…}`): each part has its own select, so no single host filter
  stands for the whole string;
- a section not closed by `]`, or text between sections that is not one.

Pure: no IO.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Final

import msgspec

from crr.projections.select.lexer import fail
from crr.schemas.errors import ExpressionError

SECTIONS: Final = ("select", "order", "rusage", "span", "same", "cu", "affinity")
"""LSF's section names (a simple requirement string)."""

_SELECT_WORDS: Final = frozenset({"has", "has_any", "has_all", "and", "or", "not", "true",
                                   "false"})
"""Keywords of the select language: before a `[` they are not section names (`has_any [`)."""
_CLOSERS: Final = {"[": "]", "(": ")"}


class Section(msgspec.Struct, frozen=True, kw_only=True):
    """A section of a requirement string that crr does not evaluate (the scheduler's)."""

    name: str
    """`order`, `rusage`, `span`, `same`, `cu` or `affinity`."""
    text: str
    """The section as written, e.g. `rusage[mem=100]`."""
    column: int
    """0-based offset of the section name in the requirement string."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """A requirement string split into its select expression and the other sections."""

    select: tuple[int, int] | None
    """The span of the select expression proper (inside `select[...]`, or the shorthand);
    None when the string has other sections but no select: every host matches."""
    ignored: tuple[Section, ...]
    """The other sections, in the order written."""


def note(ignored: tuple[Section, ...] | list[Section], has_select: bool = True) -> str | None:
    """The one-line note callers show about the sections crr does not evaluate (None: none)."""
    if not ignored:
        return None
    names = " ".join(s.text for s in ignored)
    head = "" if has_select else "no select section: every host matches; "
    return (f"{head}crr evaluates the select section only; {names} "
            f"{'is' if len(ignored) == 1 else 'are'} for the scheduler and not evaluated")


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _is_word_char(ch: str) -> bool:
    return ch == "_" or (ch.isascii() and ch.isalnum())


def _word_at(text: str, i: int) -> int:
    """End of the identifier starting at `i` (== i if there is none)."""
    if i < len(text) and (text[i] == "_" or (text[i].isascii() and text[i].isalpha())):
        j = i + 1
        while j < len(text) and _is_word_char(text[j]):
            j += 1
        return j
    return i


def _header(text: str, i: int) -> tuple[str, int] | None:
    """`(name, index of '[')` if a section header `name [` starts at `i`."""
    j = _word_at(text, i)
    if j == i:
        return None
    k = _skip_space(text, j)
    if k < len(text) and text[k] == "[" and text[i:j] not in _SELECT_WORDS:
        return text[i:j], k
    return None


def _skip_string(text: str, i: int) -> int:
    """Index just after the quoted string starting at `i` (backslash escapes, as the lexer)."""
    quote = text[i]
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == quote:
            return j + 1
        else:
            j += 1
    raise ExpressionError(f"unterminated string: no closing {quote}", expression=text, column=i)


def _close(text: str, name: str, open_at: int) -> int:
    """Index of the `]` that closes the `[` at `open_at` (nesting and quotes honoured)."""
    stack = [open_at]
    i = open_at + 1
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_string(text, i)
            continue
        if ch in _CLOSERS:
            stack.append(i)
        elif ch in "])":
            opener = text[stack[-1]]
            if ch != _CLOSERS[opener]:
                fail(f"'{ch}' does not match the '{opener}' at column {stack[-1]}", text, i)
            stack.pop()
            if not stack:
                return i
        i += 1
    if len(stack) > 1:
        fail(f"'{text[stack[-1]]}' is not closed", text, stack[-1])
    raise ExpressionError(f"'{name}[' is not closed by ']'", expression=text, column=open_at)


def _shorthand_end(text: str, i: int) -> int:
    """End of a select expression written without `select[`: the first top-level section."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            i = _skip_string(text, i)
            continue
        if ch in "{}" and depth == 0:
            return i
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth = max(0, depth - 1)
        elif depth == 0 and (i == 0 or not (_is_word_char(text[i - 1]) or text[i - 1] == ".")):
            if _header(text, i) is not None:
                return i
            j = _word_at(text, i)
            if j > i:
                i = j
                continue
        i += 1
    return i


def _unknown(name: str, text: str, column: int) -> None:
    close = difflib.get_close_matches(name, SECTIONS, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    fail(f"unknown section '{name}' (LSF's sections: {', '.join(SECTIONS)}){hint}",
         text, column)


def split(text: str) -> Requirement:
    """Split a requirement string (see the module doc); raises ExpressionError."""
    i = _skip_space(text, 0)
    select: tuple[int, int] | None = None
    select_at = -1
    ignored: list[Section] = []
    previous: str | None = None
    while i < len(text):
        if text[i] in "{}":
            fail("compound and alternative requirements ('{...}') are not supported: crr "
                 "evaluates one simple requirement string; give one part's select[...]",
                 text, i)
        header = _header(text, i)
        if header is None:
            if previous is not None:
                fail(f"unexpected text after '{previous}[...]' (a select expression without "
                     "'select[' must come first)", text, i)
            end = _shorthand_end(text, i)
            stop = len(text[:end].rstrip())
            select, select_at, previous = (i, max(i, stop)), i, "select"
            i = end
            continue
        name, open_at = header
        if name not in SECTIONS:
            _unknown(name, text, i)
        close = _close(text, name, open_at)
        if name == "select":
            if select is not None:
                fail(f"a second select section (the first is at column {select_at}): LSF "
                     "takes one per requirement; join the conditions with && in one",
                     text, i)
            select, select_at = (open_at + 1, close), i
        else:
            ignored.append(Section(name=name, text=text[i:close + 1], column=i))
        previous = name
        i = _skip_space(text, close + 1)
        if name == "rusage" and text.startswith("||", i):
            after = _skip_space(text, i + 2)
            nxt = _header(text, after)
            if nxt is None or nxt[0] != "rusage":
                fail("'||' between sections joins alternative rusage[...] sections only",
                     text, i)
            i = after
    if select is None and not ignored:
        select = (i, i)  # nothing at all: the parser reports an empty expression
    return Requirement(select=select, ignored=tuple(ignored))
