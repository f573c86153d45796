#!/usr/bin/env python3
"""Random-weight GGUF with a real model's architecture, for timing only (see scripts/randomgguf.py).

python scripts/make_random_gguf.py --like qwen2.5-7b --tokenizer-from DRAFT.gguf --out 7b-random.gguf
"""

import sys

from randomgguf import main

if __name__ == "__main__":
    sys.exit(main())
