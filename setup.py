"""The one thing pyproject.toml cannot say in a stable form: the optional C module.

Command jobs are vforked by `supervisor/_vfork.c` where it could be built (docs/DECISIONS.md,
"Command jobs are spawned, not forked"); without a C compiler the install goes on without it
and command jobs are spawned through setpriv and sh, or forked. (setuptools' own
`[tool.setuptools.ext-modules]` table is still marked experimental.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("supervisor._vfork", ["supervisor/_vfork.c"], optional=True)])
