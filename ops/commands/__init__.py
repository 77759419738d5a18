"""`crr` sub-commands: each module has `register(subparsers, common)`; `crr.cli` finds them."""
