"""Pure tests: planners, verification, sampling, text, registry, options. No llama.cpp, no model files."""
