"""The naming rules of the schedulers the bridges feed, so a bad name fails at catalog apply.

A feature declared in `exports.features` becomes a Slurm node feature, an NFD
label (`feature.node.kubernetes.io/crr-<name>` by default) and an HTCondor
ClassAd attribute (`crr_<name>`); each target rejects some names, and finding
out on 50k nodes at run time is too late.  The rules:

- Slurm: a feature list is comma separated and constraints use `| & ( ) [ ] ! *`
  and spaces as operators, so none of those may appear in a feature name.
- NFD (Kubernetes label rules, `pkg/apis/nfd/validate`): the name part of a label
  key is at most 63 characters, `[A-Za-z0-9]` at both ends and `[-A-Za-z0-9_.]`
  between; a value is empty or the same shape.
- HTCondor ClassAd attribute names: letters, digits and `_`, not starting with a digit.
"""

from __future__ import annotations

import re
from typing import Final

SLURM_FORBIDDEN: Final = frozenset(",|&()[]!* \t\n")
NFD_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
NFD_MAX: Final = 63
NFD_FEATURE_PREFIX: Final = "crr-"
"""What the NFD bridge puts before an export's name in the label's name part."""
CLASSAD_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CLASSAD_PREFIX: Final = "crr_"
"""What the HTCondor bridge puts before an export's name in its attribute name."""


def slurm_feature_problem(name: str) -> str | None:
    """Why Slurm would not take `name` as a node feature (None: it would)."""
    if not name:
        return "Slurm: a feature name must not be empty"
    bad = sorted({c for c in name if c in SLURM_FORBIDDEN})
    if bad:
        return (f"Slurm: a feature name must not contain {' '.join(repr(c) for c in bad)} "
                "(commas, spaces and | & ( ) [ ] ! * are Slurm's list and constraint syntax)")
    return None


def _nfd_problem(what: str, text: str) -> str | None:
    """NFD's rule for a label name part or a non-empty value (the same shape)."""
    if len(text) > NFD_MAX:
        return f"NFD: a label {what} is at most {NFD_MAX} characters, {text!r} has {len(text)}"
    if not NFD_NAME.match(text):
        return (f"NFD: label {what} {text!r} must start and end with a letter or digit and "
                "contain only letters, digits, '-', '_' and '.'")
    return None


def nfd_name_problem(name: str) -> str | None:
    """Why NFD would reject `name` as a label's name part (None: it would accept it)."""
    return _nfd_problem("name", name)


def nfd_value_problem(value: str) -> str | None:
    """Why NFD would reject `value` as a label value (None: it would accept it; empty is fine)."""
    return None if value == "" else _nfd_problem("value", value)


def classad_name_problem(name: str) -> str | None:
    """Why HTCondor would not parse `name` as a ClassAd attribute name (None: it would)."""
    if not CLASSAD_NAME.match(name):
        return (f"HTCondor: ClassAd attribute {name!r} must be letters, digits and '_', "
                "not starting with a digit")
    return None


def feature_name_problems(name: str) -> list[str]:
    """Every target rule an exported feature (or value) `name` breaks, with its prefix."""
    found = [slurm_feature_problem(name), nfd_name_problem(NFD_FEATURE_PREFIX + name),
             classad_name_problem(CLASSAD_PREFIX + name)]
    return [p for p in found if p is not None]
