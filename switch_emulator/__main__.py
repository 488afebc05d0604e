"""``python -m switch_emulator``: same as ``homagg switch`` (errors print as there: exit status 2)."""

import argparse
import sys

from homagg._errors import HomAggError

from ._cli import configure_parser, run

parser = argparse.ArgumentParser(prog="python -m switch_emulator", description="homagg Python switch emulator")
configure_parser(parser)
try:
    sys.exit(run(parser.parse_args()))
except HomAggError as exc:
    print(f"python -m switch_emulator: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(2)
