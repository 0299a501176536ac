"""``sparseps keys DIR [--force]``: write a job key pair for authenticated transport.

The folder is created with mode 0700 and the two key files with 0600. The command prints
where it wrote them and the public key; the secret key is never printed. Copy the folder
to every host of the job (``scp -rp`` keeps the modes) and start the job with
``sparseps launch --secure --key-dir DIR`` (docs/security.md).
"""

from __future__ import annotations

import argparse

from .security import PUBLIC_FILE, SECRET_FILE, write_job_keys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="folder to create for the job's keys")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace keys already in DIR (every process using the old ones is locked out)",
    )


def run(args: argparse.Namespace) -> int:
    keys = write_job_keys(args.dir, force=args.force)
    print(
        f"wrote the job key pair to {keys.source}/ (folder 0700; {PUBLIC_FILE}, {SECRET_FILE} "
        f"0600); public key {keys.public.decode()}. Copy the folder to every host of the job "
        f"(scp -rp keeps the modes) and run: sparseps launch --secure --key-dir {keys.source} ..."
    )
    return 0
