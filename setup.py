"""The one build step pyproject.toml cannot declare: the optional C accelerator of the log parser.

`optional=True`: without a C compiler the install still succeeds and shadowlab.logparse runs its
pure-Python path (same events, slower); `python -m shadowlab.logs.parse --which` says which is used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shadowlab.logs._logscan",
            ["shadowlab/logs/_logscan.c"],
            optional=True,
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
