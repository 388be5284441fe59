"""Why a value could not be decoded into its column's type: one text per reason, shared by both implementations."""
from __future__ import annotations

INVALID = 1              # the bytes are not a value of the type in that format
INTERNAL_UNSUPPORTED = 2  # an internal ('i') datum of a type whose internal layout is not read
MULTIDIMENSIONAL = 3     # a multi-dimensional array value (typed mode keeps 1-D arrays as lists)
SPECIAL_DECIMAL = 4      # NaN or ±Infinity in a numeric(p,s) column decoded as decimal128
OUT_OF_RANGE = 5         # a valid value that does not fit the Arrow type
INVALID_UTF8 = 6         # text that is not UTF-8
BYTE_ORDER_UNKNOWN = 7   # an internal datum, but the startup message did not say the server's byte order
LOWER_BOUND = 9          # a one-dimensional array whose lower bound is not 1 (a list has no bounds)
TOO_LARGE = 8            # the value alone takes its column past Arrow's 32-bit offsets (2 GiB - 1 bytes) in a batch
NO_TEXT_FORM = 16        # a binary value holding a value of a type whose send format is unknown (no text form)
# internal ('i') varlena datums (spockwire.values.internal.describe_datum_failure gives their text and byte)
VARLENA_INVALID = 20     # the varlena header does not describe the bytes that arrived
EXTERNAL_DATUM = 21      # an external TOAST pointer instead of the datum
COMPRESSED_CORRUPT = 22  # inline-compressed data that is not a valid pglz/LZ4 stream of the declared raw size
RAW_SIZE_MISMATCH = 23   # inline-compressed data that decompresses to fewer bytes than the declared raw size
LAYOUT_INVALID = 24      # the data of a jsonb, tsvector, tsquery or jsonpath datum is not a valid layout of the type
NO_ROLE_NAMES = 25       # an aclitem, whose text names roles, without a catalog that reads role names

OFFSET_LIMIT = 0x7FFFFFFF  # most bytes (elements, for lists) a variable-length column holds in one batch


class ValueFailure(Exception):
    """A value could not be decoded; `code` is one of the codes above."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class DatumFailure(Exception):
    """A refused internal datum: `code` (one of the codes above), `pos` (byte of the datum), `detail` (text)."""

    def __init__(self, code: int, pos: int, detail: str) -> None:
        super().__init__(code, pos, detail)
        self.code = code
        self.pos = pos
        self.detail = detail

_FORMATS = {0x74: "text", 0x62: "binary", 0x69: "internal"}


def value_problem(code: int, fmt: int, raw: bytes, type_name: str) -> str:
    """The sentence a ProtocolError carries for a value that could not be decoded."""
    form = _FORMATS.get(fmt, "?")
    shown = bytes(raw[:40])
    if code == INTERNAL_UNSUPPORTED:
        return (f"internal-format value of type {type_name} cannot be decoded: its internal layout is not read "
                f"(stream without internal values, binary=True, or keep the column raw: types='raw' or "
                f"column_types)")
    if code == MULTIDIMENSIONAL:
        return (f"multi-dimensional {form} array value of type {type_name} has no list form "
                f"(on_unrepresentable='text' keeps the column as PostgreSQL's text)")
    if code == LOWER_BOUND:
        return (f"{form} array value of type {type_name} has a lower bound other than 1, which a list cannot keep "
                f"(on_unrepresentable='text' keeps the column as PostgreSQL's text)")
    if code == SPECIAL_DECIMAL:
        return (f"NaN or infinite value in a {type_name} column has no decimal128 form "
                f"(on_unrepresentable='text' keeps the column as PostgreSQL's text)")
    if code == OUT_OF_RANGE:
        return f"{form} value {shown!r} is out of range for {type_name}"
    if code == INVALID_UTF8:
        return f"{form} value of type {type_name} is not valid UTF-8"
    if code == BYTE_ORDER_UNKNOWN:
        return (f"internal-format value of type {type_name} needs the server's byte order "
                f"(binary.bigendian in the startup message)")
    if code == TOO_LARGE:
        return (f"{form} value of type {type_name} does not fit one batch: its column's data would pass "
                f"{OFFSET_LIMIT} bytes, the limit of Arrow's 32-bit offsets")
    if code == NO_TEXT_FORM:
        return (f"{form} value of type {type_name} holds a value of a type whose binary format is unknown "
                f"(stream this table in the text format, or use types='raw')")
    if code == NO_ROLE_NAMES:
        return (f"{form} value of type {type_name} names its roles by OID: its text needs a type catalog that "
                f"reads role names (type_catalog=PostgresTypeCatalog(dsn), or StaticTypeCatalog(roles=...))")
    if code in (VARLENA_INVALID, EXTERNAL_DATUM, COMPRESSED_CORRUPT, RAW_SIZE_MISMATCH, LAYOUT_INVALID):
        return f"internal-format value of type {type_name} is not a valid varlena datum"
    return f"cannot decode {form} value {shown!r} as {type_name}"
