"""The errors a caller of this client must tell apart.

- `MeridianError`: the server answered with an `Error` (its code and detail). Whether to
  retry depends on the code: `RATE_LIMITED` later, `REJECTED` (the game said no) or
  `INVALID_ARGUMENT` not as it is.
- `NotApplied`: the connection dropped and the player was resumed before this move or
  action was answered. The server did not apply it; send it again if it still makes sense.
- `ConnectionClosed`: the connection is gone for good (logged out, replaced by another
  login, the resume window passed, or closed by the caller). Connect and log in again.
"""

from __future__ import annotations

from . import client_pb2 as pb


def error_code_name(code: int) -> str:
    try:
        return pb.ErrorCode.Name(code)
    except ValueError:
        return f"ERROR_CODE_{code}"


class MeridianError(Exception):
    """The server's `Error`: `code` is an `ErrorCode` value, `detail` its text."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{error_code_name(code)}: {detail}")
        self.code = code
        self.detail = detail

    @property
    def code_name(self) -> str:
        return error_code_name(self.code)


class NotApplied(Exception):
    """A move or action interrupted by a drop and resume: the server never applied it."""


class ConnectionClosed(Exception):
    """The connection is closed and will not resume."""
