"""The files a spec may read: inside its own folder tree, regular, and not too large.

A spec is shared like code, and what it reads is sent to models (templates become
prompts, data items become messages), so ``file("/etc/passwd")``, ``../`` paths and
symlinks that lead out of the spec's folder would let a shared spec ship a user's files
to an endpoint of its author's choosing. Every spec-relative path, at check time
(templates, data digests) and at run time (data loading), goes through ``open_spec_file``:

- the path is resolved (``..`` and every symlink followed) and must stay inside the
  spec's folder tree, itself resolved;
- the file must be a regular file (not a device such as ``/dev/zero``, a FIFO, a
  socket or a folder); it is stat'ed before opening and opened non-blocking, so a FIFO
  can never block;
- its size is capped: ``MAX_TEMPLATE_BYTES`` for template files (their text is embedded
  in the IR), ``MAX_DATA_BYTES`` for data files, ``MAX_RECORD_BYTES`` for one record of
  a data file.

A refusal is a ``FileRefused`` (diagnostic E304); a file that does not exist is
``FileNotFoundError`` as before (E303).
"""

from __future__ import annotations

import os
import stat
from typing import IO, Any, BinaryIO

MAX_TEMPLATE_BYTES = 1024 * 1024  # as for a spec file
MAX_DATA_BYTES = 1024 * 1024 * 1024  # 1 GiB: data files are hashed at check time and loaded at run time
# One data record (a jsonl line, a text field of a parquet row): 1 MiB of text is far past
# any model's context, so a longer record is a mistake to report, not a prompt to send.
MAX_RECORD_BYTES = 1024 * 1024
# A JSON file a command is handed or keeps between its steps (a --replay recording, the
# inner-loop service's state for --promotions, an OpenRLHF job's buffer state): read whole
# and parsed, so capped well below what parsing it would take in memory.
MAX_STATE_BYTES = 256 * 1024 * 1024


def record_too_large(size: int) -> str:
    """The message for a record of `size` bytes, past MAX_RECORD_BYTES."""
    return (f"a record of {size:,} bytes, more than the limit of {MAX_RECORD_BYTES:,} bytes for one record "
            f"(far past any model's context): shorten it or leave it out of the data set")


class FileRefused(ValueError):
    """A spec-relative path the spec may not read; ``str()`` is the one-line reason.
    (A ValueError, so callers that report bad input as ValueError report it too.)"""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def human_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def resolve_spec_path(spec_dir: str, rel: str) -> str:
    """The real path of ``rel`` (relative to ``spec_dir``), or FileRefused when it leads
    outside the spec's folder tree. Does not require the file to exist."""
    if "\x00" in rel:
        raise FileRefused(f"{rel!r} is not a valid path (NUL character)")
    root = os.path.realpath(spec_dir)
    real = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, real]) != root:
        lexical = os.path.normpath(os.path.join(root, rel))
        if os.path.commonpath([root, lexical]) == root:
            raise FileRefused(f"{rel} leads through a symlink to {real}, outside the spec's folder")
        raise FileRefused(f"{rel} is outside the spec's folder")
    return real


def spec_relative(spec_dir: str, rel: str) -> str:
    """``rel`` as a clean relative path inside the spec's folder (``a/../b.j2`` -> ``b.j2``,
    an absolute path inside the folder -> relative), for recording the file with a run.
    Call after ``resolve_spec_path`` accepted ``rel``."""
    root = os.path.realpath(spec_dir)
    lexical = os.path.normpath(os.path.join(root, rel))
    if os.path.commonpath([root, lexical]) != root:  # inside only once symlinks are followed
        lexical = os.path.realpath(lexical)
    return os.path.relpath(lexical, root).replace(os.sep, "/")


def open_regular(path: str, max_bytes: int | None = None, shown: str | None = None) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (no more than ``max_bytes``),
    without ever blocking on a FIFO. Raises FileRefused or OSError."""
    shown = shown or path
    st = os.stat(path)  # FileNotFoundError when missing
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{shown} is {_kind(st.st_mode)}, not a regular file")
    # O_NONBLOCK: if the path was swapped for a FIFO since the stat, opening cannot hang
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{shown} is {_kind(st.st_mode)}, not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileRefused(f"{shown} is {human_size(st.st_size)}; the limit is {human_size(max_bytes)}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: ordinary reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_spec_file(spec_dir: str, rel: str, max_bytes: int) -> BinaryIO:
    """Open ``rel`` (relative to ``spec_dir``) for reading after the checks above; the
    caller closes it. Raises FileRefused, FileNotFoundError, or another OSError."""
    return open_regular(resolve_spec_path(spec_dir, rel), max_bytes, shown=rel)


def read_regular(path: str | os.PathLike[str], max_bytes: int, shown: str | None = None) -> bytes:
    """The bytes of ``path`` if it is a regular file of no more than ``max_bytes``: what
    every file a command is handed (``--replay``, ``--promotions``, a job's state files)
    is read with, so that ``/dev/zero`` is refused rather than read without end and a FIFO
    is refused rather than waited on. A file that grew past the limit since it was
    stat'ed is refused too (at most ``max_bytes + 1`` bytes are read). Raises
    FileRefused (its message names the limit), FileNotFoundError or another OSError."""
    shown = shown or os.fspath(path)
    with open_regular(os.fspath(path), max_bytes, shown=shown) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileRefused(f"{shown} is over the limit of {human_size(max_bytes)}")
    return data


def read_spec_file(spec_dir: str, rel: str, max_bytes: int) -> bytes:
    """The bytes of ``rel`` (see ``open_spec_file``); a file that grew past the limit
    since it was stat'ed is refused too."""
    return read_regular(resolve_spec_path(spec_dir, rel), max_bytes, shown=rel)


# Parquet records are read on the calling thread. Arrow's dataset reader (`read_table`)
# starts C++ thread pools, and a process that exits while one of their threads is still
# joinable can abort in std::terminate after its work is done (exit -6, "terminate called
# without an active exception"; apache/arrow#34314). Measured here on a loaded machine: 24
# of 150 short processes reading a two-row file that way aborted at exit; none of 150
# reading it with `ParquetFile.read(use_threads=False)` and no pre-buffering, which starts
# no pool. A run, `askspec check --data` and the data converter all read parquet here.
def read_parquet_rows(source: IO[bytes], shown: str, *, check_sizes: bool = True) -> list[dict[str, Any]]:
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
