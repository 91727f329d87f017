"""Puts a built libkiln inside the package when one is found, so that
``pip install ./python`` after building kiln gives a package that needs no
KILN_LIBRARY: $KILN_BUILD_DIR, else build/ beside this folder. Without one
the package is pure Python and finds an installed libkiln at run time."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    build = os.environ.get("KILN_BUILD_DIR") or os.path.join(HERE, os.pardir, "build")
    path = os.path.join(build, "libkiln.so")
    return os.path.realpath(path) if os.path.isfile(path) else None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib:
            dst = os.path.join(self.build_lib, "kiln")
            for old in glob.glob(os.path.join(dst, "libkiln.so*")):
                os.remove(old)
            shutil.copy2(lib, os.path.join(dst, "libkiln.so"))


class Dist(Distribution):
    def has_ext_modules(self):
        # a bundled shared library makes the wheel specific to this platform
        return built_library() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=Dist)
