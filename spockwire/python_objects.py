"""Python objects, pandas and numpy from change batches (`ChangeBatch.to_pylist`, `to_pandas`, `column_numpy`).

`to_pylist` gives Decimal, datetime (UTC-aware for timestamptz), date, time, uuid.UUID, (months, days, nanoseconds)
intervals, lists, str and bytes. PostgreSQL's `infinity` / `-infinity` dates and timestamps (in Arrow the type's
largest / smallest value) are the singletons `INFINITY` / `NEG_INFINITY` (`spockwire.INFINITY`), which compare
above / below every date and datetime and print as PostgreSQL does. Finite values Python's datetime cannot hold —
years before 1 or after 9999 and the time 24:00:00 — come out as PostgreSQL's own text (`"0044-03-15 BC"`,
`"10000-01-01 00:00:00+00"`, `"24:00:00"`). Nothing becomes a wrong or missing value.

`to_pandas` is pyarrow's conversion, except that a date, timestamp or time column (or a list of them) holding a
value that conversion cannot give exactly — ±infinity, a date outside years 1-9999, 24:00:00 — is an object
column of exactly the `to_pylist` values (pyarrow would fail, or turn -infinity into NaT).
"""
from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


__all__ = ["to_pylist", "to_pandas", "numpy_view", "date_text", "timestamp_text", "PgInfinity", "INFINITY",
           "NEG_INFINITY"]

_INT32_MAX, _INT32_MIN = (1 << 31) - 1, -(1 << 31)
_INT64_MAX, _INT64_MIN = (1 << 63) - 1, -(1 << 63)
_UNIX = dt.datetime(1970, 1, 1)
_MIN_DAYS = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_MAX_DAYS = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days
_US_PER_DAY = 86_400_000_000


class PgInfinity:
    """PostgreSQL's `infinity` (`INFINITY`) or `-infinity` (`NEG_INFINITY`) date or timestamp.

    Two singletons; `str()` gives PostgreSQL's text, and they order above (below) every `datetime.date` and
    `datetime.datetime`, so sorting and range filters work on a column that holds them."""

    __slots__ = ("sign",)

    def __init__(self, sign: int) -> None:
        self.sign = sign

    def __repr__(self) -> str:
        return "spockwire.INFINITY" if self.sign > 0 else "spockwire.NEG_INFINITY"

    def __str__(self) -> str:
        return "infinity" if self.sign > 0 else "-infinity"

    def __reduce__(self) -> str:
        return "INFINITY" if self.sign > 0 else "NEG_INFINITY"

    def __hash__(self) -> int:
        return hash(("spockwire.PgInfinity", self.sign))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PgInfinity) and other.sign == self.sign

    def _cmp(self, other: object) -> int | None:
        if isinstance(other, PgInfinity):
            return (self.sign > other.sign) - (self.sign < other.sign)
        if isinstance(other, (dt.date, dt.datetime)):
            return self.sign
        return None

    def __lt__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c < 0  # type: ignore[return-value]

    def __le__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c <= 0  # type: ignore[return-value]

    def __gt__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c > 0  # type: ignore[return-value]

    def __ge__(self, other: object) -> bool:
        c = self._cmp(other)
        return NotImplemented if c is None else c >= 0  # type: ignore[return-value]


INFINITY = PgInfinity(1)
NEG_INFINITY = PgInfinity(-1)


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (astronomical year) of a day count since 1970-01-01."""
    z += 719468
    era = z // 146097          # floor division: the era that holds day z, also before year 0
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + 1 if m <= 2 else y), m, d


def _ymd_text(days: int) -> str:
    y, m, d = _civil_from_days(days)
    if y <= 0:
        return f"{1 - y:04d}-{m:02d}-{d:02d} BC"
    return f"{y:04d}-{m:02d}-{d:02d}"


def date_text(days: int) -> str:
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    return _ymd_text(days)


def timestamp_text(us: int, with_tz: bool) -> str:
    if us == _INT64_MAX:
        return "infinity"
    if us == _INT64_MIN:
        return "-infinity"
    days, rest = divmod(us, 86_400_000_000)
    secs, frac = divmod(rest, 1_000_000)
    clock = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    if frac:
        clock += f".{frac:06d}".rstrip("0")
    date = _ymd_text(days)
    bc = date.endswith(" BC")
    text = f"{date[:-3] if bc else date} {clock}{'+00' if with_tz else ''}"
    return text + (" BC" if bc else "")


def _dates(array: pa.Array) -> list[Any]:
    out: list[Any] = []
    for v in array.cast(pa.int32()).to_pylist():
        if v is None:
            out.append(None)
        elif _MIN_DAYS <= v <= _MAX_DAYS:
            out.append(dt.date(1970, 1, 1) + dt.timedelta(days=v))
        elif v == _INT32_MAX:
            out.append(INFINITY)
        elif v == _INT32_MIN:
            out.append(NEG_INFINITY)
        else:
            out.append(date_text(v))
    return out


def _timestamps(array: pa.Array, tz: str | None) -> list[Any]:
    out: list[Any] = []
    lo = _MIN_DAYS * 86_400_000_000
    hi = (_MAX_DAYS + 1) * 86_400_000_000 - 1
    for v in array.cast(pa.int64()).to_pylist():
        if v is None:
            out.append(None)
        elif lo <= v <= hi:
            value = _UNIX + dt.timedelta(microseconds=v)
            out.append(value.replace(tzinfo=dt.timezone.utc) if tz else value)
        elif v == _INT64_MAX:
            out.append(INFINITY)
        elif v == _INT64_MIN:
            out.append(NEG_INFINITY)
        else:
            out.append(timestamp_text(v, tz is not None))
    return out


def _times(array: pa.Array) -> list[Any]:
    # pyarrow would turn 24:00:00 (a valid PostgreSQL time) into 00:00:00
    out: list[Any] = []
    for v in array.cast(pa.int64()).to_pylist():
        if v is None:
            out.append(None)
        elif v >= _US_PER_DAY:
            out.append("24:00:00")
        else:
            secs, frac = divmod(v, 1_000_000)
            out.append(dt.time(secs // 3600, secs // 60 % 60, secs % 60, frac))
    return out


def _column(array: pa.Array) -> list[Any]:
    t = array.type
    if pa.types.is_date32(t):
        return _dates(array)
    if pa.types.is_timestamp(t):
        return _timestamps(array, t.tz)
    if pa.types.is_time64(t):
        return _times(array)
    if pa.types.is_list(t):
        flat = _column(array.values)
        offsets = array.offsets.to_pylist()
        return [None if not array[i].is_valid else flat[offsets[i]:offsets[i + 1]] for i in range(len(array))]
    if pa.types.is_fixed_size_binary(t) and t.byte_width == 16:
        # uuid is the only type decoded to fixed_size_binary(16): also uuid[], domains over uuid, and pglogical
        # columns typed by a catalog (whose Relation carries no type OIDs)
        return [None if v is None else uuid.UUID(bytes=v) for v in array.to_pylist()]
    return array.to_pylist()


def to_pylist(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows of a change batch as dicts of Python values (see the module description).

    Values are converted by their Arrow types alone, so columns typed through a catalog (pglogical, whose
    relation carries no type OIDs) convert like pgoutput's."""
    names = batch.schema.names
    columns = [_column(batch.column(i)) for i in range(len(names))]
    return [dict(zip(names, row)) for row in zip(*columns)]


def _needs_python(array: pa.Array) -> bool:
    """True when pyarrow's pandas conversion cannot give every value of this temporal column exactly."""
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _needs_python(array.flatten())
    if not (pa.types.is_date32(t) or pa.types.is_timestamp(t) or pa.types.is_time64(t)) or \
            len(array) == array.null_count:
        return False
    bounds = pc.min_max(array.cast(pa.int32() if pa.types.is_date32(t) else pa.int64()))
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if pa.types.is_date32(t):
        return lo < _MIN_DAYS or hi > _MAX_DAYS
    if pa.types.is_timestamp(t):
        return lo == _INT64_MIN or hi == _INT64_MAX
    return hi >= _US_PER_DAY


def to_pandas(batch: pa.RecordBatch, **kwargs: Any) -> Any:
    """A change batch as a pandas DataFrame (see the module description); `kwargs` go to pyarrow's `to_pandas`."""
    special = [i for i in range(batch.num_columns) if _needs_python(batch.column(i))]
    if not special:
        return batch.to_pandas(**kwargs)
    import pandas as pd

    names = batch.schema.names
    rest = [i for i in range(batch.num_columns) if i not in special]
    frame = batch.select(rest).to_pandas(**kwargs) if rest else pd.DataFrame(index=pd.RangeIndex(batch.num_rows))
    for i in special:
        values = _column(batch.column(i))
        frame.insert(i, names[i], pd.Series(values, index=frame.index, dtype=object))
    return frame


def numpy_view(batch: pa.RecordBatch, name: str) -> np.ndarray:
    """A zero-copy numpy view of a fixed-width column without NULLs (ValueError otherwise)."""
    column = batch.column(batch.schema.get_field_index(name))
    if column.null_count:
        raise ValueError(f"column {name!r} has NULLs: use to_pandas() or to_pylist() for it")
    return column.to_numpy(zero_copy_only=True)
