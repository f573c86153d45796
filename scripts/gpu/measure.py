#!/usr/bin/env python3
"""Entry point of the GPU kit's measurement (logic: kit.py here; how to run: README.md here)."""

import sys

from kit import main

if __name__ == "__main__":
    sys.exit(main())
