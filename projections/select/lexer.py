"""Tokens of the `select[]` language (docs/contract.md, "The `select[]` language"), with their
offsets in the expression.

Offsets are 0-based columns into the text the operator wrote (including any
`select[` wrapper), so every error can point at its token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NoReturn

from crr.schemas.errors import ExpressionError

TokenKind = Literal["num", "str", "ident", "op", "eof"]

# Longest first, so `<=` wins over `<`.
OPERATORS = (
    "&&", "||", "==", "!=", "<=", ">=",
    "<", ">", "!", "+", "-", "*", "/", "(", ")", "[", "]", ",",
)
_HINTS = {"&": "&&", "|": "||", "=": "=="}


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, source text, span and (for literals) value."""

    kind: TokenKind
    text: str
    start: int
    end: int
    value: float | str | None = None

    def describe(self) -> str:
        """How an error message names this token."""
        if self.kind == "eof":
            return "the end of the expression"
        if self.kind == "str":
            return f"string {self.text}"
        if self.kind == "num":
            return f"number {self.text}"
        return f"'{self.text}'"


def fail(message: str, expression: str, column: int) -> NoReturn:
    """Raise the ExpressionError for `column` of `expression`."""
    raise ExpressionError(message, expression=expression, column=column)


def _is_ident_start(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_ident(ch: str) -> bool:
    return _is_ident_start(ch) or ("0" <= ch <= "9")


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def next_token(expression: str, i: int, stop: int) -> Token:
    """The token at or after offset `i` (whitespace skipped); `eof` at `stop`."""
    text = expression
    while i < stop and text[i].isspace():
        i += 1
    if i >= stop:
        return Token("eof", "", stop, stop)
    ch = text[i]
    if ch in "'\"":
        return _string(text, i, stop)
    if _is_digit(ch) or (ch == "." and i + 1 < stop and _is_digit(text[i + 1])):
        return _number(text, i, stop)
    if _is_ident_start(ch):
        j = i + 1
        while j < stop and _is_ident(text[j]):
            j += 1
        return Token("ident", text[i:j], i, j)
    for op in OPERATORS:
        if text.startswith(op, i) and i + len(op) <= stop:
            return Token("op", op, i, i + len(op))
    hint = f"; did you mean '{_HINTS[ch]}'?" if ch in _HINTS else ""
    fail(f"unexpected character '{ch}'{hint}", text, i)


def bare_word_end(expression: str, i: int, stop: int) -> int:
    """End of the LSF bare word (letters, digits, `_`, `.`, `-`) at `i`; `i` if none starts there.

    A bare word starts with a letter, digit or `_` (`RHEL4.6`, `1.3.29`,
    `XeonE5-2650`); the parser takes one only where a string is expected.
    """
    if i >= stop or not _is_ident(expression[i]):
        return i
    j = i + 1
    while j < stop and (_is_ident(expression[j]) or expression[j] in ".-"):
        j += 1
    return j


def _string(text: str, start: int, stop: int) -> Token:
    quote = text[start]
    chars: list[str] = []
    i = start + 1
    while i < stop:
        ch = text[i]
        if ch == "\\" and i + 1 < stop:
            chars.append(text[i + 1])
            i += 2
        elif ch == quote:
            return Token("str", text[start:i + 1], start, i + 1, "".join(chars))
        else:
            chars.append(ch)
            i += 1
    fail(f"unterminated string: no closing {quote}", text, start)


def _number(text: str, start: int, stop: int) -> Token:
    i = start
    while i < stop and _is_digit(text[i]):
        i += 1
    if i < stop and text[i] == ".":
        i += 1
        while i < stop and _is_digit(text[i]):
            i += 1
    if i < stop and text[i] in "eE":
        j = i + 1
        if j < stop and text[j] in "+-":
            j += 1
        if j < stop and _is_digit(text[j]):
            i = j
            while i < stop and _is_digit(text[i]):
                i += 1
    if i < stop and (_is_ident(text[i]) or text[i] == "."):
        j = i
        while j < stop and (_is_ident(text[j]) or text[j] == "."):
            j += 1
        fail(f"invalid number '{text[start:j]}' (quote it if it is a string: "
             f"'{text[start:j]}')", text, start)
    value = float(text[start:i])
    if not math.isfinite(value):
        fail(f"number out of range: {text[start:i]}", text, start)
    return Token("num", text[start:i], start, i, value)
