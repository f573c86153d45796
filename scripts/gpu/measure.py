#!/usr/bin/env python3
"""Entry point of the GPU kit's measurement (logic: edgespec/gpukit.py; how to run: README.md here)."""

import sys

from edgespec.gpukit import main

if __name__ == "__main__":
    sys.exit(main())
