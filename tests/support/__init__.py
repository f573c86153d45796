"""The tests' helpers (fakes, synthetic engines, servers, the real pair's loaders) and the child scripts
that tests start by path. Import them as ``tests.support.NAME``; scripts/ modules through
``tests.support.scripts.load``."""
