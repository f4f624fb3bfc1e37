"""The package as pip would build it: the source distribution holds the
library, its README and LICENSE and metadata, and not the tests. Built with
setuptools alone (no network, no wheel package needed)."""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import venv

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class PackageTest(unittest.TestCase):
    def test_sdist_holds_exactly_the_library(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            # A copy, so that the build's egg-info stays out of the tree;
            # the LICENSE symlink is copied as the file it points to.
            shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            out = os.path.join(tmp, "dist")
            subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])", out],
                           cwd=src, check=True, capture_output=True)
            (name,) = os.listdir(out)
            with tarfile.open(os.path.join(out, name)) as tar:
                files = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
                top = name[: -len(".tar.gz")]
                pkg_info = tar.extractfile(top + "/PKG-INFO").read().decode()
                requires = tar.extractfile(top + "/toolsidecar_worker.egg-info/requires.txt").read().decode()
        for want in ["toolsidecar_worker/__init__.py", "toolsidecar_worker/py.typed", "README.md", "LICENSE", "pyproject.toml", "PKG-INFO"]:
            self.assertIn(want, files)
        self.assertFalse([f for f in files if f.startswith(("tests/", "examples/"))], files)
        self.assertIn("Name: toolsidecar-worker", pkg_info)
        self.assertEqual(requires.split(), ["nats-py>=2.15", "[pydantic]", "pydantic>=2"])  # pydantic only as an extra
        self.assertIn("License: Apache-2.0", pkg_info)
        self.assertIn("Classifier: License :: OSI Approved :: Apache Software License", pkg_info)
        self.assertIn("Classifier: Typing :: Typed", pkg_info)
        self.assertIn("Requires-Python: >=3.10", pkg_info)
        with open(os.path.join(ROOT, "..", "..", "LICENSE")) as f:
            self.assertIn("Apache License", f.read())


# The offline install of docs/workers.md for an interpreter whose setuptools
# cannot build a wheel (older than 70.1, and no wheel package): pip then has
# no way to install from source, setuptools' own install command has.
OFFLINE_INSTALL = ["-c", "import setuptools; setuptools.setup()", "install", "--single-version-externally-managed", "--record"]


class OfflineInstallWithoutWheelTest(unittest.TestCase):
    def test_install_without_wheel(self):
        with tempfile.TemporaryDirectory() as tmp:
            env_dir = os.path.join(tmp, "venv")
            venv.create(env_dir, with_pip=True)  # pip and setuptools from ensurepip: no network
            py = os.path.join(env_dir, "bin", "python")
            probe = subprocess.run([py, "-c", "import setuptools, importlib.util as u; print(setuptools.__version__, u.find_spec('wheel') is not None)"],
                                   check=True, capture_output=True, text=True).stdout.split()
            if probe[1] == "True" or tuple(int(x) for x in probe[0].split(".")[:2]) >= (70, 1):
                self.skipTest(f"setuptools {probe[0]} here can build wheels: pip install --no-build-isolation --no-index --no-deps works")
            src = os.path.join(tmp, "src")
            shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
            # What the documentation said before: pip needs wheel to build.
            pip = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", src], capture_output=True, text=True)
            self.assertNotEqual(pip.returncode, 0, "pip built the package without wheel: document that way instead")
            subprocess.run([py, *OFFLINE_INSTALL, os.path.join(tmp, "files.txt")], cwd=src, check=True, capture_output=True)
            show = subprocess.run([py, "-m", "pip", "show", "-f", "toolsidecar-worker"], check=True, capture_output=True, text=True).stdout
            self.assertIn("Version: 0.2.0", show)
            self.assertIn("Requires: nats-py", show)
            where = subprocess.run([py, "-c", "import importlib.util as u; print(u.find_spec('toolsidecar_worker').origin)"],
                                   check=True, capture_output=True, text=True).stdout.strip()
            self.assertTrue(where.startswith(env_dir), where)
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(where), "py.typed")), "py.typed was not installed")
            subprocess.run([py, "-m", "pip", "uninstall", "-y", "toolsidecar-worker"], check=True, capture_output=True)

    def test_documented(self):
        with open(os.path.join(ROOT, "..", "..", "docs", "workers.md")) as f:
            doc = f.read()
        cmd = "python3 -c 'import setuptools; setuptools.setup()' " + " ".join(OFFLINE_INSTALL[2:])
        self.assertIn(cmd, doc, "docs/workers.md does not give the offline install without wheel that this test runs")


if __name__ == "__main__":
    unittest.main()
