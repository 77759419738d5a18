"""The scheduler's cached copy of the snapshot, held column-wise (`table.HostTable`).

- `table`: `HostTable`, its five ways in and what readers ask of it;
- `rows`: which host has which row, and what each row keeps;
- `column`: a resource's arrays over all rows (`Column`), a cluster value, the freshness rule;
- `cells`: writing one cell, or many rows at once; `bulk_values`: many raw values as arrays;
- `bulk_fill`: many records written at once; `staging`: rows upserted one by one, written
  together;
- `string_pool`: string values by code;
- `record_codec`: how the table reads records (lean body, `Crr-Columns` header) for its
  catalog.

The host record itself — its representations, writers and readers, and the state codes
the columns hold — lives in `crr.projections.record`.
"""

from crr.projections.host_table.column import BoolArray, ClusterValue, Column, FloatArray, IntArray
from crr.projections.host_table.table import LOAD_CHUNK, HostTable

__all__ = ["LOAD_CHUNK", "BoolArray", "ClusterValue", "Column", "FloatArray", "HostTable",
           "IntArray"]
