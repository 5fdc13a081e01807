"""What can go wrong between here and the Hub, each as one sentence for the user."""

from __future__ import annotations

from moescope.util.errors import MoEScopeError


class HubError(MoEScopeError):
    """A search, listing, header read or download that failed for a reason worth telling.

    ``detail``: the system's own words for the cause ("[Errno -2] Name or service not
    known"), kept out of the sentence for a tooltip or the log."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class HubUnreachable(HubError):
    """No connection: no network, a wrong proxy, the endpoint down, or offline mode."""


class HubNotFound(HubError):
    """The repository, revision or file does not exist (or is private)."""


class HubGated(HubError):
    """401/403: a gated or private repository without a token that is allowed in."""


class DiskFullError(HubError):
    """Not enough free space, found before the download or while writing."""


class HashMismatchError(HubError):
    """The downloaded bytes are not the ones the Hub lists (sha256): the file is deleted."""


class DownloadInterrupted(HubError):
    """The connection broke and retries did not help; the partial file is kept for resume."""


class DownloadBusy(HubError):
    """Another MoEScope (window or ``moescope pull``) is downloading the same model now."""


class DownloadCancelled(HubError):
    """Cancelled by the user; the partial file is kept for resume."""
