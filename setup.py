"""The one compiled part of edgespec: the logits-row kernels (edgespec/decoding/_rows.c, plain C over the
buffer protocol, no numpy headers). Everything else is declared in pyproject.toml.

-fno-trapping-math lets the compiler vectorise the clamps; -Wno-psabi quiets a note on the vector
clones' calling convention (internal functions only). scripts/gpu/build.sh compiles the same file with
the same flags where the package is not installed.
"""

from setuptools import Extension, setup

ROWS = Extension(
    "edgespec.decoding._rows",
    sources=["edgespec/decoding/_rows.c"],
    extra_compile_args=["-O3", "-fno-trapping-math", "-fno-math-errno", "-Wno-psabi"],
)

setup(ext_modules=[ROWS])
