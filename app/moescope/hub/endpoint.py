"""The Hub's address, checked before anything parses it.

``HF_ENDPOINT`` points MoEScope (and ``huggingface_hub``) at a mirror. One the URL parser
refuses (``http://[::1``, a port past 65535) was a traceback, and from ``huggingface_hub``'s
own import: so this module imports nothing of it, and ``moescope pull`` asks
:func:`check_environment` before it imports the Hub client.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from moescope.hub.errors import HubError

MAX_ENDPOINT = 2000
"""Longest ``HF_ENDPOINT`` taken."""


def check_endpoint(url: str) -> str:
    """``url`` if it can be the Hub's address (http or https, a host, a valid port, no
    space or control character), else :class:`HubError` naming ``HF_ENDPOINT``: an
    address the HTTP library cannot parse (``http://[::1``, a port past 65535, a newline)
    was a ValueError or InvalidURL traceback."""
    shown = repr(url[:80]) + ("…" if len(url) > 80 else "")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise HubError(f"HF_ENDPOINT {shown} is not a URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"HF_ENDPOINT {shown} is not an http:// or https:// address with a "
                       "host")
    if port == 0 or len(url) > MAX_ENDPOINT or not url.isprintable() or " " in url:
        raise HubError(f"HF_ENDPOINT {shown}: not a usable address (a port of 0, a space "
                       f"or a control character, or over {MAX_ENDPOINT} characters)")
    return url


def check_environment() -> None:
    """:func:`check_endpoint` of ``HF_ENDPOINT``, if set."""
    url = os.environ.get("HF_ENDPOINT")
    if url:
        check_endpoint(url)
