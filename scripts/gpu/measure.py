#!/usr/bin/env python3
"""Entry point of the GPU kit's measurement (logic: kit.py here; how to run: README.md here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts/: randomgguf

from kit import main  # noqa: E402 - after the path

if __name__ == "__main__":
    sys.exit(main())
