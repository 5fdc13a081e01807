"""The *Get models* window (File ▸ Get models…): the Hub, each file's fit, downloads.

The window module (and with it ``huggingface_hub``, ~0.2 s) is imported on first use, not
when the main window starts.
"""

from __future__ import annotations

from typing import Any


def show_get_models(main: Any) -> Any:
    """Show (creating on first use) ``main``'s Get models window; see
    :func:`moescope.gui.hub.window.show_get_models`. An ``HF_ENDPOINT`` that is not an
    address (``huggingface_hub``'s own import raises on it) is one line in a box, and the
    window is not opened (None)."""
    from moescope.hub.endpoint import check_environment
    from moescope.hub.errors import HubError

    try:
        check_environment()
    except HubError as err:
        main.notify("Cannot use the Hugging Face Hub", str(err))
        return None
    from moescope.gui.hub.window import show_get_models as show

    return show(main)
