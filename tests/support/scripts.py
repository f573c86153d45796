"""The one way tests import a module of scripts/ or scripts/gpu/ (randomgguf, kit, ...; a dotted name for
a subfolder's, as "llama_build.cuda"): scripts/ is not on the tests' path. ``load("randomgguf")``
executes the file once and registers it in ``sys.modules`` under its own name, so pickling and a
script's own ``from randomgguf import ...`` work as when run; while it executes, scripts/ and
scripts/gpu/ are on ``sys.path``, so the siblings it imports load the same way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "scripts", ROOT / "scripts" / "gpu")


def load(name: str) -> ModuleType:
    """The script module ``name`` (scripts/NAME.py or scripts/gpu/NAME.py, dots as folders), loaded once."""
    file = f"{name.replace('.', '/')}.py"
    path = next((folder / file for folder in FOLDERS if (folder / file).is_file()), None)
    if path is None:
        raise ModuleNotFoundError(f"no scripts/{file} nor scripts/gpu/{file}", name=name)
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() != path:
            raise ImportError(f"{name} is already imported from elsewhere: {loaded!r}", name=name)
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    added = [str(folder) for folder in FOLDERS if str(folder) not in sys.path]
    sys.path[:0] = added
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        for folder in added:
            sys.path.remove(folder)
    return module
