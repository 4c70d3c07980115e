"""A parquet data file's records, read on the calling thread.

Arrow's dataset reader (``pyarrow.parquet.read_table``) starts C++ thread pools, and a
process that exits while one of their threads is still joinable can abort in
``std::terminate`` after its work is done (exit -6, "terminate called without an active
exception"; apache/arrow#34314). Measured here on a loaded machine: 24 of 150 short
processes that read a two-row file that way aborted at exit; none of 150 reading it
with ``ParquetFile.read(use_threads=False)`` and no pre-buffering, which starts no pool.
A run, ``askspec check --data`` and the data converter all read parquet here, so none of
them can report failure for work it finished.
"""

from __future__ import annotations

from typing import IO, Any

from .paths import MAX_RECORD_BYTES, record_too_large


def read_rows(source: IO[bytes], shown: str, *, check_sizes: bool = True) -> list[dict[str, Any]]:
    """The rows of the parquet file open as ``source``, as dicts. With ``check_sizes`` a
    text or bytes field past MAX_RECORD_BYTES is a ValueError naming ``shown``, its row
    and field (as a JSON line past it is). A file that is not parquet is a ValueError."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(source, pre_buffer=False).read(use_threads=False)
    except Exception as e:  # pyarrow's errors have no common base worth naming
        raise ValueError(f"{shown}: not a parquet file ({e})") from None
    if check_sizes:
        _check_record_sizes(table, shown)
    return table.to_pylist()


def _check_record_sizes(table: Any, shown: str) -> None:
    """Refuse a row whose text or bytes field is past MAX_RECORD_BYTES."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, col in zip(table.column_names, table.columns):
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_binary(col.type)
                or pa.types.is_large_binary(col.type)):
            continue
        lengths = pc.binary_length(col)
        longest = pc.max(lengths).as_py()
        if longest is not None and longest > MAX_RECORD_BYTES:
            row = pc.index(pc.greater(lengths, MAX_RECORD_BYTES), True).as_py()
            raise ValueError(f"{shown}: row {row + 1}, field '{name}': {record_too_large(lengths[row].as_py())}")
