"""The one build step pyproject.toml cannot declare: the optional C accelerator of the log parser.

`optional=True`: without a C compiler the install still succeeds and shadowlab.logparse runs its
pure-Python path (same events, slower); `python -m shadowlab.logs.parse --which` says which is used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shadowlab.logs._logscan",
            # the module, its line scanner, `shadowlab logs`' fold and figures (shadowlab/logs/_logscan.h)
            ["shadowlab/logs/_logscan.c", "shadowlab/logs/_logscan_scan.c", "shadowlab/logs/_logscan_fold.c",
             "shadowlab/logs/_logscan_figures.c"],
            depends=["shadowlab/logs/_logscan.h", "shadowlab/logs/_logscan_constants.h"],
            optional=True,
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
        )
    ]
)
