"""Build of the optional C extension core._speedups (everything else is in pyproject.toml).

The extension is optional: where no C compiler is available the install still succeeds
and the store uses the same functions in Python (core/store/speedups.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "core._speedups",
            ["core/_speedups.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        )
    ]
)
