"""`m3fleet crd [--kind KIND]`: the CustomResourceDefinition YAML (identical to the file in crds/)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from m3fleet.api import KIND
from m3fleet.api.cache import CACHE_KIND
from m3fleet.api.crd import crd_yaml
from m3fleet.exitcodes import EXIT_OK


def register(sub: Any) -> None:
    parser = sub.add_parser("crd", help="the CustomResourceDefinition YAML")
    parser.add_argument("--kind", choices=(KIND, CACHE_KIND), default=KIND, help="which CRD (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml(args.kind))
    return EXIT_OK
