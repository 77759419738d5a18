"""The series mapping of an exposition reporter: Prometheus series → a typed resource.

A reporter of `type: textfile`, `type: scrape` or `format: prometheus` reads the
Prometheus text exposition format and maps its series to the resources it owns
with one PromQL-like line per resource (`series:` in `resources.yaml`; the
grammar is in docs/contract.md "Exposition reporters"):

    mapping  := term { ("*" | "/") NUMBER } [ CMP NUMBER ]
    term     := AGG "(" selector ")"                  AGG: min max sum count avg
              | "labels" "(" selector "," LABEL ")"   a string_set of label values
              | "label" "(" selector "," LABEL ")"    a string (one series)
              | selector                              one series' value
    selector := METRIC [ "{" matcher { "," matcher } "}" ]
    matcher  := LABEL ( "=" | "!=" | "=~" | "!~" ) STRING
    CMP      := "==" | "!=" | "<" | "<=" | ">" | ">="

A comparison makes a boolean, `labels` a string_set, `label` a string, anything
else a number.  Matchers have Prometheus' semantics: a missing label equals "",
`=~`/`!~` are fully anchored regular expressions.  Compiled (and checked against
the resource's kind) when the catalog is loaded, so `crr catalog apply` rejects a
bad mapping with the column of the offending token, as it does `select[]`.
Pure: no IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NoReturn

import msgspec

from crr.schemas.errors import ExpressionError

AGGREGATIONS = ("min", "max", "sum", "count", "avg")
MatchOp = Literal["=", "!=", "=~", "!~"]
CmpOp = Literal["==", "!=", "<", "<=", ">", ">="]
MappedKind = Literal["numeric", "boolean", "string", "string_set"]

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|=~|!~|<=|>=|[{}(),=<>*/])
""", re.VERBOSE)


class InventoryMap(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Devices from per-device series: one device per distinct value of label `by`.

    `devices` is a selector (`DCGM_FI_DEV_GPU_TEMP` or with matchers); every series
    it matches with a non-empty `by` label is a device named `prefix` + that value
    (`prefix` defaults to the label name: `gpu0`).  `attributes` are mappings
    evaluated over that device's series only (the series whose `by` label is the
    device's): numbers become int attributes (rounded: DRA attributes have no
    floats), comparisons bool, `label(…)` string.
    """

    devices: str
    by: str = "gpu"
    prefix: str | None = None
    pool: str | None = None
    attributes: dict[str, str] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher; `regex` is the anchored compiled pattern of `=~`/`!~`."""

    label: str
    op: MatchOp
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        """Prometheus semantics: a label the series lacks has the value ""."""
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        assert self.regex is not None
        hit = self.regex.fullmatch(have) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True, slots=True)
class Selector:
    """A metric name and its label matchers."""

    metric: str
    matchers: tuple[Matcher, ...] = ()
    text: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a series of this metric with `labels` is selected."""
        return all(m.matches(labels) for m in self.matchers)


@dataclass(frozen=True, slots=True)
class Mapping:
    """A compiled mapping: what to select, how to fold it, scale and compare."""

    text: str
    selector: Selector
    function: str | None = None
    """An aggregation, `labels`, `label`, or None (exactly one series)."""
    label: str | None = None
    scale: float = 1.0
    compare: tuple[CmpOp, float] | None = None

    @property
    def kind(self) -> MappedKind:
        """The resource kind this mapping produces."""
        if self.compare is not None:
            return "boolean"
        if self.function == "labels":
            return "string_set"
        if self.function == "label":
            return "string"
        return "numeric"


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    start: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            _fail(f"unexpected character {text[pos]!r}", text, pos)
        kind = m.lastgroup or ""
        if kind != "space":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    out.append(_Tok("eof", "", len(text)))
    return out


def _fail(message: str, text: str, column: int) -> NoReturn:
    raise ExpressionError(message, expression=text, column=column)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, message: str, tok: _Tok | None = None) -> NoReturn:
        tok = tok or self.tok
        found = "the end of the mapping" if tok.kind == "eof" else repr(tok.text)
        _fail(f"{message}, found {found}", self.text, tok.start)

    def expect(self, text: str) -> _Tok:
        if self.tok.text != text or self.tok.kind == "str":
            self.fail(f"expected {text!r}")
        return self.take()

    def ident(self, what: str) -> _Tok:
        if self.tok.kind != "ident":
            self.fail(f"expected {what}")
        return self.take()

    def number(self) -> float:
        if self.tok.kind != "num":
            self.fail("expected a number")
        return float(self.take().text)

    def mapping(self) -> Mapping:
        head = self.tok
        function: str | None = None
        label: str | None = None
        if head.kind == "ident" and self.toks[self.i + 1].text == "(":
            if head.text not in (*AGGREGATIONS, "labels", "label"):
                self.fail("expected min, max, sum, count, avg, labels or label before '('",
                          head)
            function = self.take().text
            self.take()
            selector = self.selector()
            if function in ("labels", "label"):
                self.expect(",")
                label = self.label_name()
            self.expect(")")
        else:
            selector = self.selector()
        scale = 1.0
        while self.tok.text in ("*", "/") and self.tok.kind == "op":
            op = self.take()
            if function in ("labels", "label"):
                self.fail("a label value cannot be scaled", op)
            factor = self.number()
            if op.text == "/" and factor == 0:
                _fail("division by zero", self.text, op.start)
            scale = scale * factor if op.text == "*" else scale / factor
        compare: tuple[CmpOp, float] | None = None
        if self.tok.text in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()
            if function in ("labels", "label"):
                self.fail("a label value cannot be compared with a number", op)
            compare = (op.text, self.number())  # type: ignore[assignment]  # checked above
        if self.tok.kind != "eof":
            self.fail("expected *, /, a comparison or the end of the mapping")
        return Mapping(text=self.text, selector=selector, function=function, label=label,
                       scale=scale, compare=compare)

    def label_name(self) -> str:
        tok = self.ident("a label name")
        if ":" in tok.text:
            self.fail("a label name has no ':'", tok)
        return tok.text

    def selector(self) -> Selector:
        start = self.tok.start
        metric = self.ident("a metric name").text
        matchers: list[Matcher] = []
        if self.tok.text == "{" and self.tok.kind == "op":
            self.take()
            while not (self.tok.text == "}" and self.tok.kind == "op"):
                label = self.label_name()
                op = self.tok
                if op.text not in ("=", "!=", "=~", "!~") or op.kind != "op":
                    self.fail("expected =, !=, =~ or !~")
                self.take()
                if self.tok.kind != "str":
                    self.fail("expected a quoted string")
                value_tok = self.take()
                value = _unquote(value_tok.text)
                regex = None
                if op.text in ("=~", "!~"):
                    try:
                        regex = re.compile(value)
                    except re.error as exc:
                        _fail(f"bad regular expression: {exc}", self.text, value_tok.start)
                matchers.append(Matcher(label, op.text, value, regex))  # type: ignore[arg-type]
                if self.tok.text == ",":
                    self.take()
                elif not (self.tok.text == "}" and self.tok.kind == "op"):
                    self.fail("expected ',' or '}'")
            self.take()
        return Selector(metric, tuple(matchers), self.text[start:self.toks[self.i - 1].start
                                                            + len(self.toks[self.i - 1].text)])


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def compile_mapping(text: str) -> Mapping:
    """Compile one mapping line; ExpressionError (with the column) if it is not one."""
    if not text.strip():
        _fail("empty mapping", text, 0)
    return _Parser(text).mapping()


def compile_selector(text: str) -> Selector:
    """Compile a bare selector (an inventory's `devices`)."""
    parser = _Parser(text)
    selector = parser.selector()
    if parser.tok.kind != "eof":
        parser.fail("expected the end of the selector")
    return selector


def where(path: str, exc: ExpressionError) -> str:
    """One catalog problem line pointing at the offending token (as `select[]` errors)."""
    expr = exc.expression
    col = min(max(exc.column, 0), len(expr))
    return f"{path}: {exc.message} (at column {col + 1}: {expr[:col]}\u2192{expr[col:]})"
