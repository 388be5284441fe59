from .errors import FrameError as FrameError, ProtocolError as ProtocolError, SpockwireError as SpockwireError, \
    TruncatedMessage as TruncatedMessage
from .model import ChangeBatch as ChangeBatch, Column as Column, LogicalMessage as LogicalMessage, \
    Relation as Relation, Truncate as Truncate
from .connection.stream import connect as connect
from .export.python import INFINITY as INFINITY, NEG_INFINITY as NEG_INFINITY, PgInfinity as PgInfinity
from .wire._decoder import Decoder as Decoder
from .wire.spock_messages import SpockRepairMode as SpockRepairMode, SpockSyncEvent as SpockSyncEvent, \
    spock_message as spock_message

__impl__: str
__version__: str
__all__: list[str]
