"""The router's HTTP/1.1 client to its backends: keep-alive connections per endpoint
(`pool.py`), one connection's framing (`connection.py`), an answer read as it arrives
(`response.py`), what it raises (`errors.py`) and the file-descriptor accounting every
connection goes through (`descriptors.py`). The names below are the client's interface."""

from .errors import ClientError as ClientError
from .errors import Cut as Cut
from .errors import Disconnected as Disconnected
from .errors import ErrorRecord as ErrorRecord
from .errors import Headers as Headers
from .errors import OutOfDescriptors as OutOfDescriptors
from .errors import Timeout as Timeout
from .errors import TooLarge as TooLarge
from .errors import Unreachable as Unreachable
from .errors import record_too_large as record_too_large
from .pool import FETCH_LIMIT as FETCH_LIMIT
from .pool import IDLE_S as IDLE_S
from .pool import Pool as Pool
from .pool import TimeoutLike as TimeoutLike
from .pool import Upstream as Upstream
from .response import Response as Response
