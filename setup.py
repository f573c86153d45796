"""edgespec's one compiled part, optional: ``edgespec.engine._rows``, the logits-row kernels
(``_row_kernels.h``: the draft's top-k with its softmax normaliser, the target's argmax and margin, one
vectorised pass per row; plain C through the buffer protocol, no numpy headers, nothing of llama.cpp).

``optional=True``: where it does not build (no C compiler, one without GCC's vector extensions), the
package installs without it and ``engine/rows.py`` computes the same ids in numpy. Everything else
is declared in pyproject.toml. -fno-trapping-math lets the compiler vectorise the clamps; -Wno-psabi
quiets a note on the vector clones' calling convention (internal functions only).
"""

from setuptools import Extension, setup

ROWS = Extension(
    "edgespec.engine._rows",
    ["edgespec/engine/_rows.c"],
    depends=["edgespec/engine/_row_kernels.h"],
    extra_compile_args=["-O3", "-fno-trapping-math", "-fno-math-errno", "-Wno-psabi"],
    optional=True,
)

setup(ext_modules=[ROWS])
