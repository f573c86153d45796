"""Write the chat-templated text of each prompt in a set to DIR/<set>-<slug>.txt, the exact text edgespec's
bench decodes, for other tools to read (llama.cpp's `-f`): docs/benchmarks.md compares with them.

    python scripts/dump_prompts.py edit,prose /tmp/edgespec-prompts
"""
import sys
from pathlib import Path

from edgespec.engine import EngineSettings, ModelPair
from edgespec.measure.prompts import prompt_set
from edgespec.models.store import ModelStore

sets, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
store = ModelStore()
spec = store.registry.pair("qwen2.5-coder-1.5b+0.5b")
with ModelPair(str(store.path_for(spec.target.name)), None, EngineSettings(threads=1)) as pair:
    model = pair.target.model
    for case in prompt_set(sets):
        text = model.apply_chat_template([{"role": r, "content": c} for r, c in case.messages])
        path = out / (case.name.replace("/", "-") + ".txt")
        path.write_text(text, encoding="utf-8")
        print(path, len(model.tokenize(text, add_special=True, parse_special=True)), "tokens")
