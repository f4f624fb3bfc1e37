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


if __name__ == "__main__":
    unittest.main()
