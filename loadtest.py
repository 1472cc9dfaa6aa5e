#!/usr/bin/env python3
"""python loadtest.py --mock-backend --ramp 8,32,64,128 (see `python loadtest.py --help`)."""

import sys

from loadtest.cli import main

if __name__ == "__main__":
    sys.exit(main())
