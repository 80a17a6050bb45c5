"""Installs the `trellis` package from a build tree (the C++ module is built by CMake):

    cmake --build build --target trellis_python
    TRELLIS_BUILD_DIR=build /usr/bin/python3 -m pip install worker-lib/python
(inside a virtual environment made with --system-site-packages, or with --user). The CMake
alternative: cmake --install build --component python --prefix /usr/local
"""
import glob
import os

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
build = os.path.abspath(os.environ.get("TRELLIS_BUILD_DIR", os.path.join(here, "..", "..", "build")))
pkg = os.path.join(build, "python", "trellis")
if not glob.glob(os.path.join(pkg, "_trellis*.so")):
    raise SystemExit("setup.py: no trellis/_trellis*.so under %s: build the trellis_python target "
                     "first, or set TRELLIS_BUILD_DIR to the build tree" % os.path.dirname(pkg))

setup(
    name="trellis",
    version="0.1.0",
    description="Trellis distributed training: Python and PyTorch binding",
    packages=["trellis"],
    package_dir={"trellis": os.path.relpath(pkg, here)},
    package_data={"trellis": ["_trellis*.so"]},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
