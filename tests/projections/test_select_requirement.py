"""Whole LSF requirement strings, LSF bare words and the `!` ambiguity (docs/contract.md, "The
`select[]` language", issue 14).

Requirement strings are written as `bsub -R` takes them (IBM's documented
section syntax); crr evaluates the select section and reports the others.
Their errors (unknown section, bare word on the left, ambiguous `!`, …) and
columns are in test_select_errors.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crr.projections.select import ExpressionError, compile_select, explain
from crr.projections.select.requirement import SECTIONS, split
from tests.support.select import CATALOG, NOW, make_table

TABLE = make_table({
    "h1": {"free": 5.0, "os": "RHEL4.6", "arch": "XeonE5-2650", "ok": True},
    "h2": {"free": 50.0, "os": "1.3.29", "arch": "x86_64", "ok": False},
    "h3": {"free": 500.0, "os": "rhel9", "arch": "XeonE5-2650", "ok": True},
})


def hosts(expr: str) -> list[str]:
    """The hosts `expr` selects in TABLE (columnar), checked against the reference interpreter."""
    compiled = compile_select(expr, CATALOG)
    got = compiled.select(TABLE, NOW)
    assert got == [h for h in TABLE.hosts() if compiled.matches(TABLE, h, NOW)]
    return got


# -- sections ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [s for s in SECTIONS if s != "select"])
def test_every_lsf_section_is_accepted_and_reported(name: str) -> None:
    """Each LSF section name after a select section: parsed, reported, not evaluated."""
    section = f"{name}[x=1]"
    expr = f"select[free > 10] {section}"
    compiled = compile_select(expr, CATALOG)
    assert [(s.name, s.text, s.column) for s in compiled.ignored_sections] == [
        (name, section, 18)]
    assert compiled.note is not None
    assert section in compiled.note
    assert "not evaluated" in compiled.note
    assert hosts(expr) == ["h2", "h3"]


def test_whole_string_with_every_section_and_nesting() -> None:
    """IBM-doc forms together: spaces before '[', nested brackets and parentheses, '||', ':'."""
    expr = ("select [ free > 10 && ok ]  rusage[mem=(100):duration=10 || mem=50, lic=1] "
            "order[-slots:maxslots:ut] span[hosts=1] same[model] "
            "affinity[core(2,same=socket,exclusive=(socket,injob))*4:cpubind=socket] "
            "cu[type=enclosure:maxcus=2]")
    compiled = compile_select(expr, CATALOG)
    assert [s.name for s in compiled.ignored_sections] == [
        "rusage", "order", "span", "same", "affinity", "cu"]
    assert compiled.ignored_sections[3].text == "same[model]"
    assert compiled.ignored_sections[4].text.endswith("cpubind=socket]")
    assert hosts(expr) == ["h3"]


def test_sections_in_any_order() -> None:
    """The select section may come after the others."""
    assert hosts("rusage[mem=100] order[ut] select[free > 10]") == ["h2", "h3"]
    req = split("rusage[mem=100] select [free > 10]")
    assert req.select == (len("rusage[mem=100] select ["), len("rusage[mem=100] select [free > 10"))


def test_shorthand_select_before_sections() -> None:
    """LSF's shorthand: leading text without a section keyword is the select section."""
    assert hosts("free > 10 && ok order[ut] rusage[mem=1]") == ["h3"]
    assert hosts('tags has_any ["a"] || free > 100 same[model]') == ["h3"]
    compiled = compile_select("ok span[hosts=1]", CATALOG)
    assert [s.name for s in compiled.ignored_sections] == ["span"]


def test_quoted_bracket_inside_sections() -> None:
    """A quoted `]` closes neither the select section nor another one."""
    assert hosts("select[os != 'a]b' && free > 10] rusage[x='q]']") == ["h2", "h3"]
    compiled = compile_select('os == "x]" order["]"]', CATALOG)
    assert compiled.ignored_sections[0].text == 'order["]"]'


def test_rusage_alternatives_between_sections() -> None:
    """`rusage[...] || rusage[...]` (LSF's older alternative form) is two ignored sections."""
    compiled = compile_select("select[ok] rusage[mem=100] || rusage[swap=100]", CATALOG)
    assert [s.text for s in compiled.ignored_sections] == ["rusage[mem=100]", "rusage[swap=100]"]


def test_no_select_section_matches_every_host() -> None:
    """Only other sections: every host matches (as LSF's default select), and the note says so."""
    compiled = compile_select("rusage[mem=100] span[hosts=1]", CATALOG)
    assert compiled.resources == frozenset()
    assert compiled.note is not None
    assert compiled.note.startswith("no select section: every host matches")
    assert hosts("rusage[mem=100]") == ["h1", "h2", "h3"]
    why = explain(compiled, TABLE, "h1", NOW)
    assert why.selected
    assert why.tree is not None
    assert why.tree.text == "(no select section: every host)"


def test_bare_and_wrapped_have_no_note() -> None:
    """Plain expressions report no ignored sections."""
    for expr in ("free > 10", "select[free > 10]"):
        compiled = compile_select(expr, CATALOG)
        assert compiled.ignored_sections == ()
        assert compiled.note is None


def test_the_issue_example_no_longer_fails_inside_rusage() -> None:
    """`select[x>10] rusage[mem=100]` used to fail with "unexpected character '='"."""
    assert hosts("select[free>10] rusage[mem=100]") == ["h2", "h3"]


# -- LSF bare words ------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "expected"), [
    ("os==RHEL4.6", ["h1"]),
    ("os == 1.3.29", ["h2"]),
    ("arch==XeonE5-2650", ["h1", "h3"]),
    ("arch == XeonE5-2650 && free > 10", ["h3"]),
    ("arch==XeonE5-2650||os==1.3.29", ["h1", "h2", "h3"]),
    ("(os == RHEL4.6) || ok == false", ["h1", "h2"]),
    ("os != RHEL4.6 order[ut]", ["h2", "h3"]),
    ("select[os==RHEL4.6]", ["h1"]),
    ("os == rhel9", ["h3"]),
    ("os < RHEL5", ["h1", "h2"]),
    ("region == x-1", []),
])
def test_bare_words_are_strings_right_of_a_string_resource(expr: str,
                                                           expected: list[str]) -> None:
    """Words with dots, digits and dashes compare as strings (as LSF users write them)."""
    assert hosts(expr) == expected


def test_bare_word_tree_is_one_string() -> None:
    """The right operand is one string literal spanning the whole word."""
    compiled = compile_select("arch == XeonE5-2650 && ok", CATALOG)
    right = compiled.tree.left.right  # type: ignore[attr-defined]
    assert (right.value, right.start, right.end) == ("XeonE5-2650", 8, 19)


def test_dashes_stay_arithmetic_on_numbers() -> None:
    """`free-1` with `free` numeric is still subtraction; a resource name on the right resolves."""
    assert hosts("free-1 > 10") == ["h2", "h3"]
    assert hosts("free - 1 >= 49") == ["h2", "h3"]
    assert hosts("10-free < 0") == ["h2", "h3"]
    assert hosts("os == os") == ["h1", "h2", "h3"]


# -- `!` before a comparison ------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "expected"), [
    ("!ok", ["h2"]),
    ("!ok && free > 10", ["h2"]),
    ("not ok || free > 100", ["h2", "h3"]),
    ("!(free > 10)", ["h1"]),
    ("not (os == RHEL4.6)", ["h2", "h3"]),
    ("!ok == false", ["h1", "h3"]),  # boolean on the left: both readings agree
    ("!ok != drain", []),  # drain never reported: unknown either way
    ('!tags has "a"', []),  # `(!tags) has` is ill-kinded: only one reading
])
def test_unambiguous_negations(expr: str, expected: list[str]) -> None:
    """`!r` on a boolean resource alone, parenthesised comparisons and boolean equalities pass."""
    assert hosts(expr) == expected


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from([*"selctrusagodpnfm []{}()'\"\\|&=!<>.-_19,:*",
                                       "select[", "rusage[", " os == ", "free", "has_any [",
                                       "not ", "order[", "RHEL4.6"]), max_size=25))
def test_any_text_compiles_or_fails_with_a_caret(parts: list[str]) -> None:
    """Whatever is pasted, compiling either works or raises ExpressionError with a column
    inside the text — never another exception."""
    text = "".join(parts)
    column = 0
    try:
        compile_select(text, CATALOG)
    except ExpressionError as err:
        column = err.column
    assert 0 <= column <= len(text)
