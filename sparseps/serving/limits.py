"""What one request may cost, and the error a request the service refuses gets.

:class:`RequestError` carries the HTTP status (400 malformed, 413 too large, 415 another
content type) and a message that starts with the field it is about (``rows: ...``,
``I2: ...``); its public home is :mod:`sparseps.serving.requests`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

__all__ = ["RequestError", "RequestLimits", "check_ids", "check_rows"]


class RequestError(InputError):
    """A request the service refuses; ``status`` is the HTTP status to answer."""

    # its public home, where users import it from (and pickle finds it)
    __module__ = "sparseps.serving.requests"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self) -> tuple:
        return (RequestError, (self.status, self.message))


@dataclass(frozen=True)
class RequestLimits:
    """What one request may cost; past any of them it is refused with 413.

    Attributes:
        rows: rows (``--max-rows``).
        ids: feature ids, over every slot column (``--max-ids``): a string or an integer
            slot value is one, a list of ids as many as it holds (null ones too).
        decoded_bytes: bytes an Arrow body decodes to, decompressed (``--max-body-mb``,
            the limit of the body itself).
    """

    rows: int = 65536
    ids: int = 1 << 21
    decoded_bytes: int = 64 << 20


def check_rows(rows: int, max_rows: int) -> None:
    if rows > max_rows:
        raise RequestError(
            413, f"rows: {rows} rows in one request; the limit is {max_rows} (--max-rows)"
        )


def check_ids(ids: int, max_ids: int) -> None:
    if ids > max_ids:
        raise RequestError(
            413, f"ids: {ids} feature ids in one request; the limit is {max_ids} (--max-ids)"
        )
