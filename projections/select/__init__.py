"""The `select[]` language of docs/contract.md, "The `select[]` language": parse, typecheck,
evaluate (columnar) and explain.

Pure: no IO, no clock; `now` is always an argument.

    compiled = compile_select('scratch_free > 100 && datasets has "c4"', catalog)
    compiled.select(table, now)            # sorted host names
    explain(compiled, table, "node1", now).render()

The input may be a whole LSF requirement string (`select[…] rusage[…] order[…]`):
only its select section is evaluated; `compiled.ignored_sections` and
`compiled.note` name the others (the scheduler's).
"""

from crr.projections.select.compiled import CompiledSelect, compile_select
from crr.projections.select.explain import Explanation, explain
from crr.projections.select.requirement import Section
from crr.schemas.errors import ExpressionError

__all__ = ["CompiledSelect", "Explanation", "ExpressionError", "Section", "compile_select",
           "explain"]
