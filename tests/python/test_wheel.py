"""`pip wheel .` (pyproject.toml + setup.py) packages the module this build made: the wheel holds the package and the
extension for this interpreter, declares its name and NumPy, and, unpacked alone on a fresh path, scores exactly as
the module of the build tree. The wheel reuses the tested build (RINGTRAIN_BUILD_DIR = the CLI's folder), offline
(--no-index, --no-build-isolation: Debian's setuptools and wheel). Skipped, saying why, without pip, setuptools or
wheel, or outside a CTest run (no build folder to reuse).
"""

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import zipfile

import numpy as np

import ringtrain
from common import CLI, SEED, SOURCE_DIR, base_config

MISSING = [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m) is None]
BUILD_DIR = os.path.dirname(os.path.abspath(CLI))
SKIP = (f"no {', '.join(MISSING)} for this Python" if MISSING else
        None if os.path.isfile(os.path.join(BUILD_DIR, "CMakeCache.txt")) else f"no CMake build in {BUILD_DIR}")

SCORE = """
import json, sys
import numpy as np
import ringtrain
cfg, ids = json.loads(sys.argv[1]), np.array(json.loads(sys.argv[2]))
lp = ringtrain.PolicyWorker(cfg).get_logprobs({"input_ids": ids})["logprobs"]
print(json.dumps({"file": ringtrain.__file__, "logprobs": lp.tolist()}))
"""


@unittest.skipIf(SKIP is not None, SKIP or "")
class TestWheel(unittest.TestCase):
    def test_wheel_installs_and_scores_as_the_build_tree(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, RINGTRAIN_BUILD_DIR=BUILD_DIR)
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
                                "-w", os.path.join(tmp, "dist"), SOURCE_DIR], env=env, capture_output=True, text=True,
                               timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            wheels = os.listdir(os.path.join(tmp, "dist"))
            self.assertEqual(len(wheels), 1, wheels)
            core = "ringtrain/_core" + sysconfig.get_config_var("EXT_SUFFIX")
            with zipfile.ZipFile(os.path.join(tmp, "dist", wheels[0])) as whl:
                names = whl.namelist()
                self.assertIn("ringtrain/__init__.py", names)
                self.assertIn(core, names)
                meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
                whl.extractall(os.path.join(tmp, "site"))
            self.assertIn("Name: ringtrain", meta)
            self.assertIn("Requires-Dist: numpy", meta)

            rng = np.random.default_rng(SEED + 21)
            ids = rng.integers(0, 256, (3, 17))
            cfg = base_config()
            want = ringtrain.PolicyWorker(cfg).get_logprobs({"input_ids": ids})["logprobs"]
            site = os.path.join(tmp, "site")
            r = subprocess.run([sys.executable, "-c", SCORE, json.dumps(cfg), json.dumps(ids.tolist())],
                               env=dict(os.environ, PYTHONPATH=site), capture_output=True, text=True, timeout=300,
                               cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            got = json.loads(r.stdout.strip().splitlines()[-1])
            self.assertTrue(got["file"].startswith(site), got["file"])
            np.testing.assert_array_equal(np.array(got["logprobs"], np.float32), want)
            self.assertTrue(np.all(want[:, 1:] < 0))

    def test_a_build_for_another_python_is_refused_by_name(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "other")
            os.makedirs(build)
            with open(os.path.join(build, "CMakeCache.txt"), "w") as f:
                f.write("Python3_EXECUTABLE:FILEPATH=/opt/other/python3\n")
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
                                "-w", os.path.join(tmp, "dist"), SOURCE_DIR],
                               env=dict(os.environ, RINGTRAIN_BUILD_DIR=build), capture_output=True, text=True,
                               timeout=600)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(f"the build in {build} is for the Python /opt/other/python3", r.stdout + r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "dist")) and os.listdir(os.path.join(tmp, "dist")))


if __name__ == "__main__":
    unittest.main()
