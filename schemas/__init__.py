"""Wire types, the catalog (`resources.yaml`) and the one error tree of crr."""
