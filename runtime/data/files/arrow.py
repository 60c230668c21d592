"""pyarrow, or a DataError saying how to install it (it is the optional extra `data`).

Shared by the prepared data (runtime.data.prepared) and the Parquet tables (runtime.data.tables).
"""

from __future__ import annotations

from runtime.data.errors import DataError

try:
    import pyarrow
    import pyarrow.parquet
except ImportError as error:  # pragma: no cover - the test environment installs it
    raise DataError(f"prepared data needs pyarrow ({error}): pip install 'reccompile[data]'") from None

pa = pyarrow
pq = pyarrow.parquet
