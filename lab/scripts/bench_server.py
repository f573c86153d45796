"""Run edgespec's bench prompts against any OpenAI-compatible server: see edgespec/server/bench_client.py.

    python scripts/bench_server.py http://127.0.0.1:8080/v1 --prompts quick --max-tokens 64
"""

import sys

from edgespec.server.bench_client import main

sys.exit(main())
