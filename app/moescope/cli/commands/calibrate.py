"""``moescope calibrate [FILE] [--reads N] [--block-mib M]``: measure this machine's disk
reads (O_DIRECT, random expert-sized blocks of FILE, default the demo model) and memory
copies, and save them for ``moescope replay --cost-model calibrated``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from moescope.cli.options import path_arg
from moescope.util.errors import MoEScopeError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``calibrate`` subcommand."""
    p = subparsers.add_parser(
        "calibrate", help="measure disk reads and memory copies for the replay's cost model",
        description="Read random expert-sized blocks of a file with O_DIRECT (the page "
                    "cache bypassed) and time memory copies; saved in the data folder for "
                    "replay --cost-model calibrated.")
    p.add_argument("file", type=path_arg, nargs="?", metavar="FILE",
                   help="a file on the disk the models are read from (default: the demo "
                        "model; a large GGUF gives truer random reads)")
    p.add_argument("--reads", type=int, default=64, metavar="N",
                   help="reads of each size (default 64, at most 10000)")
    p.add_argument("--block-mib", type=float, default=2.0, metavar="M",
                   help="the block read and copied, in MiB (default 2: a large expert)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moescope.sim.calibration import (
        MAX_READS,
        calibrate_machine,
        calibration_path,
        save_calibration,
    )
    from moescope.util.files import OutputPathError, check_output
    from moescope.util.resources import demo_model_path

    if not (0.004 <= args.block_mib <= 256):
        raise MoEScopeError(f"--block-mib must be 0.004..256, not {args.block_mib}")
    if not 1 <= args.reads <= MAX_READS:  # named as typed ("reads must be..." named none)
        raise MoEScopeError(f"--reads must be 1..{MAX_READS}, not {args.reads}")
    block = max(4096, round(args.block_mib * 2**20) // 4096 * 4096)
    path = args.file or demo_model_path()
    if path is None:
        raise MoEScopeError("name a file: no demo model in resources/models/")
    # where it is saved, checked before the minutes of measuring (the data folder a file,
    # calibration.json a link to the file measured): said after them, all was lost
    dest = calibration_path()
    try:
        check_output(dest, [path])
    except OutputPathError as err:
        raise MoEScopeError(f"{err.filename}: {err.strerror}; the calibration was not saved "
                            "(nothing was measured)") from None
    cal = calibrate_machine(Path(path), block=block, reads=args.reads)
    try:
        dest = save_calibration(cal)
    except OutputPathError as err:  # the measured file itself, a folder: said by the check
        raise MoEScopeError(f"{err.filename}: {err.strerror}; the calibration was not "
                            "saved") from None
    except OSError as err:  # a full disk
        raise MoEScopeError(f"{err.filename or calibration_path()}: cannot write "
                            f"({err.strerror or err}); the calibration was not saved") from None
    print(cal.describe())
    print(f"saved to {dest}; replay --cost-model calibrated prices reads from disk with it")
    return 0
