"""What an empty chat shows: what the loaded model is, and what to try.

The demo model is a 15.6M-parameter MoE trained only on Shakespeare and Python: asked about
anything else it answers with Shakespeare's lines, which reads as broken unless the window
says so. Its empty chat says what it is for (trying the expert cache) and offers prompts
from its training (a click sends one), and how to open a real model.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtWidgets import QWidget

from moescope.session.snapshots import ModelSummary
from moescope.util.resources import demo_model_path

PROMPT_SCHEME = "moescope-prompt"
DEMO_PROMPTS: tuple[str, ...] = (
    "Recite some Shakespeare.",
    "Write some Python code.",
    "Speak like a character from Shakespeare.",
    "Show me a Python function.",
)
"""Prompts of the demo model's chat training (``packaging/train_demo_model.py``): what it
does well."""


def is_demo(summary: ModelSummary | None) -> bool:
    """The bundled demo, however its path was written (relative, through a link: a
    command-line path lost the demo's prompts when compared as text)."""
    demo = demo_model_path()
    if summary is None or demo is None:
        return False
    try:
        return Path(summary.path).samefile(demo)
    except OSError:  # the file is gone or unreadable: not the demo we ship
        return False


def has_get_models(window: QWidget) -> bool:
    """The window has a Get models action (File ▸ Get models…, another feature's)."""
    return any("get models" in a.text().replace("&", "").lower() for a in window.actions())


def prompt_href(index: int) -> str:
    return f"{PROMPT_SCHEME}:{index}"


def prompt_of(href: str, prompts: tuple[str, ...] = DEMO_PROMPTS) -> str | None:
    """The prompt a welcome link stands for (None for any other link)."""
    scheme, _, rest = href.partition(":")
    if scheme != PROMPT_SCHEME or not rest.isdigit() or int(rest) >= len(prompts):
        return None
    return prompts[int(rest)]


def welcome_html(summary: ModelSummary | None, *, get_models: bool = False) -> str:
    """The empty chat's text for ``summary`` (None: no model loaded); ``get_models``: the
    window has a Get models action to name."""
    fetch = ("File ▸ Get models… downloads one" if get_models else
             "download a GGUF MoE model (Qwen3-30B-A3B, Mixtral, OLMoE…)")
    open_line = (f"<p>To chat for real, {fetch}, then open it with File ▸ Open model… "
                 f"(Ctrl+O) or drop the .gguf file on the window.</p>")
    if summary is None:
        return ("<h3>No model loaded</h3>"
                "<p>MoEScope runs a Mixture-of-Experts model with its experts in RAM and a "
                "small cache of them in VRAM, and shows what the cache does per token.</p>"
                + open_line)
    if is_demo(summary):
        prompts = "".join(f'<li><a href="{prompt_href(i)}">{html.escape(p)}</a></li>'
                          for i, p in enumerate(DEMO_PROMPTS))
        return ("<h3>The demo model</h3>"
                "<p>A 15M-parameter MoE (64 experts per layer, top-4) trained here only on "
                "Shakespeare and Python, for trying the expert cache: watch the panel on the "
                "right while it writes. It knows nothing else: asked about anything else it "
                "answers with Shakespeare's lines.</p>"
                f"<p>Prompts it does well (click one to send it):</p><ul>{prompts}</ul>"
                + open_line)
    if not summary.cache_enabled:  # a dense model: the panel stays empty
        return (f"<h3>{html.escape(summary.name)}</h3>"
                "<p>Type a message below to start. This model has no routed experts, so "
                "its expert cache is off and the panel on the right stays empty: MoEScope "
                "is made for Mixture-of-Experts models.</p>" + open_line)
    return (f"<h3>{html.escape(summary.name)}</h3>"
            "<p>Type a message below to start. The panel on the right shows, per token, "
            "which experts were in the cache, which had to be copied and which were "
            "substituted.</p>")
