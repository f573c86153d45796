"""The compiled parts of edgespec (plain C, no numpy headers); everything else is declared in pyproject.toml.

- ``edgespec.decoding._rows``: the logits-row kernels (``_row_kernels.h``) for numpy arrays.
- ``edgespec.engine._chain``: the draft's greedy chain, decoded level after level in one call (the same
  kernels; llama.cpp's functions are bound at run time from llama-cpp-python's library, not linked).
- ``edgespec.engine._dyspec``: DySpec's greedy tree (Algorithm 1) drafted in one call, the same way.
- ``edgespec.engine._opt_tree``: OPT-Tree's levels (Algorithm 1) drafted in one call, the same way.
- ``edgespec.engine._verify``: the target's greedy verification of a tree (pack, decode, walk) in one call.
- ``edgespec.engine._level``: one draft level (batch, decode, each row's top-k) in one call.

-fno-trapping-math lets the compiler vectorise the clamps; -Wno-psabi quiets a note on the vector
clones' calling convention (internal functions only). scripts/gpu/build.sh compiles the same files with
the same flags where the package is not installed.
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-fno-trapping-math", "-fno-math-errno", "-Wno-psabi"]
KERNELS = ["edgespec/decoding/_row_kernels.h", "edgespec/decoding/_row_split.h"]
NATIVE = [*KERNELS, "edgespec/engine/_native.h"]
TREES = [*NATIVE, "edgespec/engine/_tree_draft.h"]

ROWS = Extension(
    "edgespec.decoding._rows", ["edgespec/decoding/_rows.c"], depends=KERNELS, extra_compile_args=FLAGS
)
CHAIN = Extension(
    "edgespec.engine._chain", ["edgespec/engine/_chain.c"], depends=NATIVE, extra_compile_args=FLAGS
)
DYSPEC = Extension(
    "edgespec.engine._dyspec", ["edgespec/engine/_dyspec.c"], depends=TREES, extra_compile_args=FLAGS
)
OPT_TREE = Extension(
    "edgespec.engine._opt_tree", ["edgespec/engine/_opt_tree.c"], depends=TREES, extra_compile_args=FLAGS
)
VERIFY = Extension(
    "edgespec.engine._verify", ["edgespec/engine/_verify.c"], depends=NATIVE, extra_compile_args=FLAGS
)

LEVEL = Extension(
    "edgespec.engine._level", ["edgespec/engine/_level.c"], depends=NATIVE, extra_compile_args=FLAGS
)

setup(ext_modules=[ROWS, CHAIN, DYSPEC, OPT_TREE, VERIFY, LEVEL])
