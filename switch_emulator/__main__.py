"""``python -m switch_emulator``: same as ``homagg switch``."""

import argparse
import sys

from ._cli import configure_parser, run

parser = argparse.ArgumentParser(prog="python -m switch_emulator", description="homagg Python switch emulator")
configure_parser(parser)
sys.exit(run(parser.parse_args()))
