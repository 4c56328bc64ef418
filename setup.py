"""The compiled half of `pip install .` (pyproject.toml has the rest): the extension ringtrain._core comes from the
project's CMake build, target ringtrain_python, for the interpreter that runs pip.

The build folder is RINGTRAIN_BUILD_DIR when set (an existing build is reused as it is, if it was configured for this
interpreter), else build/pip-<SOABI>, configured here with Ninja, the Python module required and the tests left out.
setuptools' own staging goes to <build folder>/setuptools, emptied first, so no earlier package is ever shipped.

    python3 -m pip install .
    RINGTRAIN_BUILD_DIR=build python3 -m pip wheel --no-build-isolation --no-deps --no-index -w dist .
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("RINGTRAIN_BUILD_DIR") or
                        os.path.join(ROOT, "build", "pip-" + sysconfig.get_config_var("SOABI")))
STAGING = os.path.join(BUILD, "setuptools")


class BinaryDistribution(Distribution):
    """A platform wheel: the package carries a compiled extension."""

    def has_ext_modules(self):
        return True


def cache_value(cache, key):
    with open(cache) as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip()
    return None


def run(cmd):
    print("ringtrain: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build = BUILD
        cache = os.path.join(build, "CMakeCache.txt")
        if os.path.exists(cache):
            exe = cache_value(cache, "Python3_EXECUTABLE")
            if not exe or os.path.realpath(exe) != os.path.realpath(sys.executable):
                sys.exit(f"ringtrain: the build in {build} is for the Python {exe or '(none: module off)'}, "
                         f"not {sys.executable}; set RINGTRAIN_BUILD_DIR to another folder")
        else:
            cmd = ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DRINGTRAIN_PYTHON=ON", "-DRINGTRAIN_TESTS=OFF",
                   f"-DPython3_EXECUTABLE={sys.executable}",
                   "-DCMAKE_PREFIX_PATH=" + os.path.join(ROOT, ".deps", "root", "usr")]
            try:
                import pybind11  # pip's pybind11 where there is no pybind11-dev

                cmd.append("-Dpybind11_DIR=" + pybind11.get_cmake_dir())
            except ImportError:
                pass
            run(cmd)
        run(["cmake", "--build", build, "--target", "ringtrain_python"])
        built = os.path.join(build, "python", "ringtrain", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not os.path.isfile(built):
            sys.exit(f"ringtrain: {built} was not built")
        shutil.copy2(built, os.path.join(self.build_lib, "ringtrain"))


shutil.rmtree(STAGING, ignore_errors=True)
setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildWithCMake}, options={"build": {"build_base": STAGING}})
