"""Copy a trained parallel drafter (an `edgespec train parallel` work directory) into the package.

    python scripts/ship_parallel_drafter.py WORK NAME "COMMAND THAT TRAINED IT"
"""

import sys
from pathlib import Path

from edgespec.models.drafters import shipped_dir
from edgespec.train.export import ship

if __name__ == "__main__":
    work, name, command = sys.argv[1:4]
    record = ship(Path(work), shipped_dir(), name, command)
    print(f"{record['adapter']}: {record['bytes']} bytes, sha256 {record['sha256']}")
