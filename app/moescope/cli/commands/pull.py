"""``moescope pull REPO[:FILE|QUANT]``: a model from the Hugging Face Hub, fit checked first.

``moescope pull unsloth/Qwen3-30B-A3B-GGUF`` lists the repository's GGUF models (split
files as one) with each one's fit on this machine, read from its header over HTTP (a few
MB, nothing downloaded); ``moescope pull unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M`` shows that
file's fit and downloads it into the models folder (resumable: run it again after an
interruption), checking its sha256. ``--search WORDS`` finds GGUF repositories.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from moescope.cache.budget import format_bytes, parse_budget
from moescope.cli.options import add_ctx_argument, check_ctx, check_utf8
from moescope.util.errors import one_line
from moescope.util.words import plural


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``pull`` subcommand."""
    p = subparsers.add_parser(
        "pull",
        help="get a GGUF model from the Hugging Face Hub (fit checked before the download)",
        description="List a Hub repository's GGUF models with their fit on this machine "
                    "(from the header alone), or download one into the models folder.")
    p.add_argument("target", nargs="?", metavar="REPO[:FILE|QUANT]",
                   help="owner/name, optionally with a file name or quantization (Q4_K_M)")
    p.add_argument("--search", metavar="WORDS", help="find GGUF repositories instead")
    p.add_argument("--budget", default="25%", metavar="SIZE|PCT",
                   help="VRAM for expert slots for the fit: 12GiB, 25%% (default) or slots")
    add_ctx_argument(p)  # the KV cache the fit prices: chat's, serve's and info's
    p.add_argument("--check", action="store_true", help="show the fit, download nothing")
    p.add_argument("--dir", type=_folder, metavar="DIR",
                   help="models folder (default: MOESCOPE_MODELS_DIR, else the data folder's "
                        "models/)")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    p.add_argument("--token", help="Hub token for gated repositories (default: HF_TOKEN or "
                                   "the saved login)")
    p.set_defaults(func=run)


def _folder(text: str) -> Path:
    """``--dir``'s value: ``--dir ""`` downloaded into the current folder (``Path("")`` is
    ``.``) without a word."""
    if not text:
        raise argparse.ArgumentTypeError("is empty; name a folder (. for this one)")
    return Path(text)


def run(args: argparse.Namespace) -> int:
    from moescope.hub.endpoint import check_environment
    from moescope.hub.errors import HubError

    check_environment()  # before huggingface_hub parses HF_ENDPOINT on its import
    from moescope.hub.remote import HubClient
    from moescope.util import paths

    check_ctx(args)
    for option, text in (("--search", args.search), ("REPO[:FILE|QUANT]", args.target),
                         ("--revision", args.revision), ("--token", args.token)):
        check_utf8(option, text)  # a URL of bytes not UTF-8: a UnicodeEncodeError
    if args.search is not None:
        return _search(HubClient(token=args.token), args.search)
    if not args.target:
        raise HubError("name a repository (moescope pull owner/name[:QUANT]) or --search")
    parse_budget(args.budget)  # the arguments are checked before the Hub is asked
    # the folder is checked now and made only when a file is saved: a pull the Hub
    # refuses (or --check) left an empty models folder behind
    folder = args.dir if args.dir is not None else paths.models_dir(make=False)
    check_models_dir(folder, write=not args.check,
                     option="--dir" if args.dir is not None else "the models folder")
    repo, _, selector = args.target.partition(":")
    return _pull(HubClient(token=args.token), repo, selector, folder, args)


def check_models_dir(folder: Path, *, write: bool, option: str = "--dir") -> None:
    """``--dir`` names a folder, or one that can be made in the nearest folder above it
    that exists (writable, when ``write``): ``--dir /dev/null`` was refused only after
    the Hub had been asked (or "cannot reach huggingface.co" offline)."""
    from moescope.hub.errors import HubError

    there = folder
    while not os.path.lexists(there) and there.parent != there:
        there = there.parent
    if not there.is_dir():
        which = "" if there == folder else f" ({there} is not a folder)"
        raise HubError(f"{option} {folder}: not a folder{which}")
    if write and not os.access(there, os.W_OK | os.X_OK):
        raise HubError(f"{option} {folder}: cannot write in {there}")
    if write:  # permissions can say yes where nothing can be made (/proc, as root)
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".moescope-probe.", dir=there))
        except OSError as err:
            raise HubError(f"{option} {folder}: folder {there} does not take new files "
                           f"({err.strerror or err})") from None


def _search(client: Any, words: str) -> int:
    hits = client.search(words)
    if not hits:
        print(f"no GGUF repositories match {words!r}")
        return 0
    for h in hits:
        tags = ", ".join(t for t in (h.architecture, "MoE" if h.moe else None,
                                     "gated" if h.gated else None) if t)
        print(one_line(f"{h.repo_id:60s} {h.downloads:>10,} downloads  {tags}"))
    return 0


def _pull(client: Any, repo: str, selector: str, folder: Path, args: argparse.Namespace
          ) -> int:
    from moescope.hub.download import download_model, is_downloaded
    from moescope.hub.fit import remote_fit
    from moescope.hub.remote import pick_model

    models = client.list_models(repo, args.revision)
    if not selector:
        if not models:
            print(one_line(f"{repo}: no GGUF model files"))
            return 0
        print(f"{repo}: {plural(len(models), 'GGUF model')}; fit at a VRAM budget of "
              f"{args.budget}:")
        for m in models:  # names and numbers the Hub (or a mirror) gave: one line each
            print(one_line(f"  {m.describe()}"))
            print(one_line(f"    {remote_fit(client, m, args.budget, args.ctx).summary()}")
                  if m.complete else "    (parts missing on the Hub)")
        if len(models) > 1 or args.check:
            quant = next((m.quant for m in models if m.quant), models[0].name)
            print(one_line(f"download one with: moescope pull {repo}:{quant}"))
            return 0
    model = pick_model(models, selector) if selector else models[0]
    fit = remote_fit(client, model, args.budget, args.ctx)
    print(one_line(f"{model.describe()}: {fit.summary()}"))
    for line in fit.estimate.warnings():
        print(one_line(f"  warning: {line}"))
    if args.check:
        return 0
    if is_downloaded(folder, model):
        print(f"already downloaded: {_target(folder, model)}")
        return 0
    progress = _ProgressLine(sys.stderr)
    try:
        path = download_model(client, model, folder, on_progress=progress)
    except KeyboardInterrupt:
        progress.end()
        print("moescope: interrupted; run the same command to resume (the partial file "
              "is kept)", file=sys.stderr)
        return 130
    finally:
        progress.end()
    print(f"saved {format_bytes(model.size)}: {path}")
    print(f"chat with it: moescope chat {path}")
    return 0


def _target(folder: Path, model: Any) -> Path:
    from moescope.hub.download import model_paths
    return model_paths(folder, model)[0]


class _ProgressLine:
    """One line rewritten in place on a terminal; a line every 10% elsewhere (logs)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.shown = False
        self.next_step = 0.1
        self.last = 0.0

    def __call__(self, p: Any) -> None:
        if self.tty:
            now = time.monotonic()
            if now - self.last < 0.25 and p.done < p.total:
                return
            self.last = now
            self.out.write(f"\r\x1b[K{p.line()}")
            self.shown = True
        elif p.fraction >= self.next_step or p.done == p.total:
            self.next_step = min(int(p.fraction * 10) / 10 + 0.1, 1.0)
            self.out.write(p.line() + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.shown:
            self.out.write("\n")
            self.out.flush()
            self.shown = False
