"""Build glue only (metadata lives in setup.cfg): templates/, migrations/, systemd/ and docs/ stay
at the top of the repository and are copied into the built package, where vmplacer.resources finds them."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("templates", "migrations", "systemd", "docs")


class BuildWithResources(build_py):
    def run(self) -> None:
        super().run()
        for name in SHIPPED:
            shutil.copytree(Path(name), Path(self.build_lib) / "vmplacer" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithResources})
