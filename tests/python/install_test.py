"""The Python client installs like any package, without a C++ build and
without network: a fresh venv on Debian's interpreter (its grpcio, protobuf,
numpy and torch seen through --system-site-packages), `pip install
--no-build-isolation --no-deps` of a copy of client/python with Debian's
setuptools, and `pip wheel` the same way. The installed package (not the
source tree) then pushes and pulls a model against a real server.

Run by ctest: /usr/bin/python3 install_test.py SERVER_BINARY PACKAGE_DIR
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

SERVER = sys.argv[1]
SOURCE = os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
del sys.argv[1:3]

import server_process  # noqa: E402

# Runs in the venv, from a directory without the sources on sys.path.
CHECK = r"""
import sys, torch, modelstate
from torch import nn
assert modelstate.__file__.startswith(sys.prefix), modelstate.__file__
ms = modelstate.connect(sys.argv[1], progress=False)
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
remote = ms.push(model, "installed/mlp")
back = ms.pull("installed/mlp")
assert type(back[0]) is nn.Linear and not back.training
for key, value in model.state_dict().items():
    assert torch.equal(back.state_dict()[key], value), key
x = torch.randn(5, 4)
assert torch.allclose(remote(x), model(x), atol=1e-6)
print("installed", modelstate.__version__, "ok")
"""


class InstallTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="modelstate-install-")
        # A copy: an in-tree setuptools build writes build/ and egg-info.
        cls.src = os.path.join(cls.tmp, "src")
        shutil.copytree(SOURCE, cls.src, ignore=shutil.ignore_patterns(
            "__pycache__", "build", "*.egg-info", "CMakeLists.txt"))
        cls.venv = os.path.join(cls.tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv",
                        "--system-site-packages", cls.venv], check=True)
        cls.env = dict(os.environ, PIP_NO_INDEX="1",
                       PIP_DISABLE_PIP_VERSION_CHECK="1")
        cls.env.pop("PYTHONPATH", None)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def pip(self, *args):
        return subprocess.run(
            [os.path.join(self.venv, "bin", "pip"), *args,
             "--no-build-isolation", "--no-deps", self.src],
            check=True, capture_output=True, text=True, env=self.env)

    def test_pip_wheel_holds_the_stubs(self):
        wheels = os.path.join(self.tmp, "wheels")
        self.pip("wheel", "-w", wheels)
        [wheel] = glob.glob(os.path.join(wheels, "modelstate-*.whl"))
        names = zipfile.ZipFile(wheel).namelist()
        for name in ("modelstate/__init__.py", "modelstate/_push.py",
                     "modelstate/v1/model_state_service_pb2.py",
                     "modelstate/v1/model_state_service_pb2_grpc.py"):
            self.assertIn(name, names)

    def test_pip_install_then_push_and_pull(self):
        self.pip("install")
        server = server_process.Server(SERVER)
        try:
            out = subprocess.run(
                [os.path.join(self.venv, "bin", "python"), "-c", CHECK,
                 server.address], cwd=self.tmp, env=self.env,
                capture_output=True, text=True)
        finally:
            server.stop()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"^installed \S+ ok\n$")


if __name__ == "__main__":
    unittest.main(verbosity=2)
