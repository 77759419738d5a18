"""select[] parse and kind errors point at the offending token (column and caret line)."""

from __future__ import annotations

import pytest

from crr.projections.select import ExpressionError, compile_select
from tests.support.select import CATALOG

# (expression, column, a fragment of the message)
CASES = [
    ("", 0, "empty expression"),
    ("   ", 3, "empty expression"),
    ("select[]", 7, "empty expression"),
    ("(free > 1", 0, "unclosed '('"),
    ("(free > 1 && (ok)", 0, "unclosed '('"),
    ("free > 1)", 8, "unmatched ')'"),
    ("free > 1 &&", 9, "'&&' has no right-hand operand"),
    ("free >", 5, "'>' has no right-hand operand"),
    ("ok && && ok", 6, "expected an operand but found '&&'"),
    ("!", 0, "'!' has no right-hand operand"),
    ("os == 'rhel9", 6, "unterminated string"),
    ('os == "rhel9', 6, "unterminated string"),
    ("frob(free) > 1", 0, "unknown function 'frob'"),
    ("defined(3)", 8, "defined() takes a resource name"),
    ("count(free) > 1", 6, "count() needs a string_set"),
    ("ds > 3", 0, "cannot compare the string_set ds"),
    ("free has 'x'", 0, "'has' needs a string_set resource"),
    ("os == -3", 6, "cannot compare string os with numeric -3"),
    ("free == 'x'", 8, "cannot compare numeric free with string"),
    ("free > 1 && fre > 2", 12, "unknown resource 'fre'; did you mean 'free'?"),
    ("nosuch", 0, "unknown resource 'nosuch'"),
    ("free > 1 ok", 9, "unexpected 'ok' after a complete expression"),
    ("ok ok", 3, "unexpected 'ok'"),
    ('ds has_any ["a",]', 16, "expected a quoted string after ','"),
    ('ds has_any ["a" "b"]', 16, "expected ',' or ']'"),
    ('ds has_any ["a", 1]', 17, "expected a quoted string"),
    ('ds has_all "a"', 11, "expected a list"),
    ('ds has_any ["a"', 11, "unclosed '['"),
    ('ds has ["a"]', 7, "'has' takes one string"),
    ("free + 1", 0, "the expression must be a condition"),
    ("free && ok", 0, "'&&' needs conditions on both sides"),
    ("ok && free", 6, "but free is numeric"),
    ("!free", 1, "'!'/'not' needs a condition"),
    ("ok < true", 0, "'<' needs numbers or strings"),
    ("free < 1 < 2", 9, "comparisons cannot be chained"),
    ("free = 1", 5, "did you mean '=='?"),
    ("ok & ok", 3, "did you mean '&&'?"),
    ("free > 1 $", 9, "unexpected character '$'"),
    ("free > 3abc", 7, "invalid number '3abc'"),
    ("free > 1e999", 7, "number out of range"),
    ("[\"a\"]", 0, "a list is only allowed"),
    ("select[free > 1", 6, "'select[' is not closed"),
    ("select[free > 1] x", 17, "unexpected text after 'select[...]'"),
    ("free > -", 7, "'-' has no right-hand operand"),
    ("-os > 1", 1, "unary '-' needs a number"),
    ("os + 1 > 2", 0, "'+' needs numbers"),
    ("ok and", 3, "'and' has no right-hand operand"),
    ("ok or has", 6, "expected an operand but found 'has'"),
    ("ds == ds", 0, "cannot compare the string_set ds"),
    ("ok == 1", 6, "cannot compare boolean ok with numeric 1"),
    # whole LSF requirement strings: sections (issue 14)
    ("select[free > 10] rusge[mem=100]", 18, "unknown section 'rusge'"),
    ("select[free > 10] rusge[mem=100]", 18, "did you mean 'rusage'?"),
    ("free > 10 frobnicate[1]", 10, "unknown section 'frobnicate'"),
    ("selct[free > 10]", 0, "unknown section 'selct'"),
    ("select[ok] select[free > 1]", 11, "a second select section"),
    ("free > 1 select[ok]", 9, "a second select section"),
    ("2*{select[ok]} + 4*{select[free > 1]}", 2, "compound and alternative requirements"),
    ("{select[ok]} || {select[free > 1]}", 0, "compound and alternative requirements"),
    ("select[ok] rusage[mem=(100]", 26, "']' does not match the '('"),
    ("select[ok] rusage[mem=100", 17, "'rusage[' is not closed by ']'"),
    ("select[ok] rusage[mem=(100", 22, "'(' is not closed"),
    ("select[ok] order[ut] free > 1", 21, "unexpected text after 'order[...]'"),
    ("select[ok] rusage[mem=1] || order[ut]", 25, "'||' between sections joins"),
    ("select[ok] rusage[x='q]", 20, "unterminated string"),
    ("select[free > 10 rusage[mem=1]]", 17, "unexpected 'rusage'"),
    # LSF bare words outside a string comparison's right-hand side
    ("RHEL4.6 == os", 5, "quote it ('RHEL4.6')"),
    ("free == 1.3.29", 8, "invalid number '1.3.29' (quote it"),
    ("os == free", 6, "cannot compare string os with numeric free"),
    # `!`/`not` before an unparenthesised comparison: both readings, caret on the `!`
    ("!free > 1", 0, "write !(free > 1) to negate the comparison, or (!free) > 1 for LSF's"),
    ("ok && !os != 'b'", 6, "write !(os != 'b') to negate the comparison, or (!os) != 'b'"),
    ("not free + 1 >= 2", 0, "write not (free + 1 >= 2) to negate the comparison, or "
                             "(not free) + 1 >= 2 for LSF's reading ('not' binds tightest)"),
    ("select[ok || not os == a] rusage[mem=1]", 13, "not (os == a) to negate the comparison, "
                                                    "or (not os) == a"),
    ("!-free * 2 < 1", 0, "write !(-free * 2 < 1) to negate the comparison, or "
                          "(!-free) * 2 < 1"),
    ("!count(ds) == 0", 0, "ambiguous '!' before a comparison: write !(count(ds) == 0) to "
                           "negate the comparison, or (!count(ds)) == 0"),
]


@pytest.mark.parametrize(("expr", "column", "message"), CASES)
def test_error_points_at_token(expr: str, column: int, message: str) -> None:
    """The error names the problem, and its column and caret point at the offending token."""
    with pytest.raises(ExpressionError) as info:
        compile_select(expr, CATALOG)
    err = info.value
    assert message in err.message
    assert err.column == column
    assert err.expression == expr
    lines = err.pretty().split("\n")
    assert lines[0] == err.message
    assert lines[1] == "  " + expr
    assert lines[2] == "  " + " " * column + "^"


def test_error_is_value_error() -> None:
    """ExpressionError is a ValueError, so generic callers can catch it."""
    with pytest.raises(ValueError, match="unknown resource"):
        compile_select("nope > 1", CATALOG)


@pytest.mark.parametrize(
    "expr",
    [
        "free > 1",
        "select[free > 1]",
        "  select[ free > 1 ]  ",
        "ok",
        "os == LINUX",
        "os == 'x' && arch != \"y\"",
        "not ok and free >= 1.5e2 or !drain",
        'ds has "a" || ds has_any ["a", "b"] || ds has_all []',
        "count(ds) * 2 + -free / 3 <= 10",
        "defined(os)",
        "(((ok)))",
        "ok == false",
        "os < arch",
        "os == region",
        "lic > 0 && site_up && models has 'h100'",
        "os == 'it\\'s'",
        "select [free > 1] rusage[mem=(100):duration=10] order[-ut] span[hosts=1] "
        "same[model] cu[maxcus=2] affinity[core(2,same=socket)*4]",
        "os == RHEL4.6 && arch != XeonE5-2650 || region == 1.3.29",
        "!ok && !(free > 1) || !ok == drain",
    ],
)
def test_accepted(expr: str) -> None:
    """Every form of docs/contract.md, "The `select[]` language" compiles."""
    compiled = compile_select(expr, CATALOG)
    assert compiled.expression == expr
    assert compiled.resources <= set(CATALOG.resources)
