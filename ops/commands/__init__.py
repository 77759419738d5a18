"""`crr` sub-commands: each module has `register(subparsers, common)`; `ops.cli` finds them."""
