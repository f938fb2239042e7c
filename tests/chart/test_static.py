"""The shipped binaries are static and run in an empty root, like in a FROM scratch image.

Run by scripts/test-chart.sh after scripts/build-static.sh; HAPTIC_STATIC_DIR names the
directory holding haptic and haptic-agent. Sizes are printed (and recorded in the issue note);
the targets are under 12 MB for the controller and under 6 MB for the agent.
"""

import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

LIMITS = {"haptic": 12 * 1024 * 1024, "haptic-agent": 6 * 1024 * 1024}
# (arguments, text expected on stdout)
SMOKE = {"haptic": [(["version"], "haptic "), (["--help"], "Usage:")], "haptic-agent": [(["--help"], "haptic-agent serve")]}


class StaticBinaries(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        d = os.environ.get("HAPTIC_STATIC_DIR")
        if not d:
            raise unittest.SkipTest("HAPTIC_STATIC_DIR not set (run scripts/test-chart.sh)")
        cls.dir = Path(d)

    def test_statically_linked(self):
        for name in LIMITS:
            path = self.dir / name
            file_out = subprocess.run(["file", "-b", str(path)], capture_output=True, text=True).stdout
            self.assertRegex(file_out, r"static(-pie)? linked", f"{name}: {file_out}")
            ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
            self.assertRegex(ldd.stdout + ldd.stderr, r"statically linked|not a dynamic executable", name)

    def test_sizes(self):
        for name, limit in LIMITS.items():
            size = (self.dir / name).stat().st_size
            print(f"\n  size {name}: {size} bytes ({size / 1048576:.2f} MiB; target < {limit // 1048576} MiB)", end="")
            self.assertLess(size, limit, name)

    def test_release_agent_has_no_fault_hook(self):
        # The crash-recovery tests' fault injection exists in debug builds only.
        data = (self.dir / "haptic-agent").read_bytes()
        self.assertNotIn(b"HAPTIC_AGENT_FAULT", data)

    def test_runs_in_an_empty_root(self):
        if os.geteuid() != 0:
            self.skipTest("chroot needs root")
        with tempfile.TemporaryDirectory() as root:
            for name, cases in SMOKE.items():
                shutil.copy2(self.dir / name, Path(root) / name)
                for args, expected in cases:
                    r = subprocess.run(["chroot", root, f"/{name}", *args], capture_output=True, text=True, timeout=30)
                    self.assertEqual(r.returncode, 0, f"{name} {args}: {r.stderr}")
                    self.assertIn(expected, r.stdout, f"{name} {args}")
            self.assertEqual(sorted(os.listdir(root)), sorted(SMOKE), "the root holds nothing but the binaries")


if __name__ == "__main__":
    unittest.main()
