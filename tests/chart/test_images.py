"""The images built by scripts/build-images.sh start and work as the cluster would run them.

Run by scripts/test-chart.sh after scripts/build-images.sh; HAPTIC_IMAGES_DIR names the directory
holding the OCI archives. Each archive is unpacked layer by layer into a root of its own, and its
entrypoint runs there (chroot) as the image's user with the image's environment: no container
runtime can run here, so the root, the user and the environment are what a runtime would give.
Sizes are printed (and recorded in the issue note).
"""

import gzip
import hashlib
import io
import ipaddress
import json
import os
import random
import shutil
import signal
import stat
import socket
import subprocess
import tarfile
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "chart"

# image → the files it holds (anything else, a shell above all, fails the test)
FILES = {
    "haptic-controller": {"usr/local/bin/haptic", "usr/local/sbin/haproxy"},
    "haptic-agent": {"usr/local/bin/haptic-agent", "usr/local/sbin/haproxy"},
    "haptic-haproxy": {"usr/local/sbin/haproxy"},
}
CHART_IMAGE = {"haptic-controller": "controller", "haptic-agent": "agent"}


def unique_loopback():
    """An address of its own in 127.32.0.0/11: the Rust tests hand out 127.128.0.0/9 by process
    id, and scripts/demo.sh uses 127.64.0.0/10, so no other run's listener is on it."""
    seed = (os.getpid() << 16) ^ random.getrandbits(32)
    return str(ipaddress.IPv4Address(0x7F200000 | (seed % 0x1FFFFE) + 1))


class Image:
    """An OCI archive: its manifest, config, layers and an unpacked root."""

    def __init__(self, archive, root):
        self.archive = archive
        self.root = Path(root)
        with tarfile.open(archive) as t:
            def blob(digest):
                algo, _, hexd = digest.partition(":")
                data = t.extractfile(f"blobs/{algo}/{hexd}").read()
                assert hashlib.new(algo, data).hexdigest() == hexd, f"{archive}: blob {digest} does not match its digest"
                return data

            index = json.loads(t.extractfile("index.json").read())
            self.index = index
            self.manifest = json.loads(blob(index["manifests"][0]["digest"]))
            self.config = json.loads(blob(self.manifest["config"]["digest"]))
            self.members = {}
            for layer in self.manifest["layers"]:
                data = blob(layer["digest"])
                if layer["mediaType"].endswith("gzip"):
                    data = gzip.decompress(data)
                with tarfile.open(fileobj=io.BytesIO(data)) as lt:
                    for m in lt.getmembers():
                        name = m.name.lstrip("./").rstrip("/")
                        if name:
                            self.members[name] = m
                    lt.extractall(self.root, filter="fully_trusted")
        # What every OCI runtime adds to a container's root (runtime-spec config-linux.md, "Default
        # Devices"); the images themselves hold no /dev.
        dev = self.root / "dev"
        dev.mkdir(exist_ok=True)
        for node, minor in [("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9)]:
            os.mknod(dev / node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
            os.chmod(dev / node, 0o666)

    def files(self):
        return {n for n, m in self.members.items() if not m.isdir()}

    def run(self, argv, timeout=60, **kw):
        """Runs argv in the image's root as its user, with its environment only."""
        cfg = self.config["config"]
        env = dict(e.split("=", 1) for e in cfg.get("Env", []))
        return subprocess.run(
            ["chroot", f"--userspec={cfg['User']}", str(self.root), *argv],
            env=env, capture_output=True, text=True, timeout=timeout, **kw,
        )

    def entrypoint(self):
        return self.config["config"]["Entrypoint"]


class Images(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        d = os.environ.get("HAPTIC_IMAGES_DIR")
        if not d:
            raise unittest.SkipTest("HAPTIC_IMAGES_DIR not set (run scripts/test-chart.sh)")
        if os.geteuid() != 0:
            raise unittest.SkipTest("chroot needs root")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.images = {}
        for name in FILES:
            archive = Path(d) / f"{name}.oci.tar"
            root = Path(cls.tmp.name) / name
            root.mkdir()
            cls.images[name] = Image(archive, root)
            size = archive.stat().st_size
            unpacked = sum(m.size for m in cls.images[name].members.values() if m.isfile())
            print(f"\n  image {name}: archive {size} bytes ({size / 1048576:.1f} MiB), unpacked {unpacked / 1048576:.1f} MiB",
                  end="")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_only_the_binaries_no_shell(self):
        for name, expected in FILES.items():
            img = self.images[name]
            self.assertEqual(img.files(), expected, f"{name}: the image holds exactly its binaries")
            for shell in ["bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh"]:
                self.assertFalse((img.root / shell).exists(), f"{name}: {shell}")
            tmp = img.members.get("tmp")
            self.assertIsNotNone(tmp, f"{name}: /tmp (haproxy -c and the agent write there)")
            self.assertEqual(tmp.mode & 0o7777, 0o1777, f"{name}: /tmp is world-writable and sticky")

    def test_non_root_user_and_entrypoint(self):
        for name in FILES:
            cfg = self.images[name].config["config"]
            uid, _, gid = cfg["User"].partition(":")
            self.assertTrue(uid.isdigit() and int(uid) != 0, f"{name}: numeric non-root user, got {cfg['User']!r}")
            self.assertTrue(gid.isdigit() and int(gid) != 0, f"{name}: numeric non-root group")
            self.assertTrue(self.images[name].entrypoint(), name)
        self.assertEqual(self.images["haptic-controller"].entrypoint(), ["/usr/local/bin/haptic"])
        self.assertEqual(self.images["haptic-controller"].config["config"].get("Cmd"), ["run"])
        self.assertEqual(self.images["haptic-agent"].entrypoint(), ["/usr/local/bin/haptic-agent"])
        # The kubelet stops HAProxy with the image's STOPSIGNAL: SIGUSR1 is its soft stop
        # (SIGTERM would cut connections in flight).
        self.assertEqual(self.images["haptic-haproxy"].config["config"].get("StopSignal"), "SIGUSR1")

    def test_names_match_the_chart(self):
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        for name, key in CHART_IMAGE.items():
            image = values[key]["image"]
            expected = f"{image['registry']}/{image['repository']}:{image['tag'] or app_version}"
            ref = self.images[name].index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
            self.assertEqual(ref, expected, f"{name}: the chart's default image")

    def test_controller_validates_with_haproxy_in_its_own_root(self):
        # `haptic validate` runs the libraries' embedded tests, many of them `haproxy -c` on the
        # rendered configuration (certificates included): the image's haproxy, as its user.
        img = self.images["haptic-controller"]
        self.assertEqual(img.run([*img.entrypoint(), "version"]).returncode, 0)
        libs = img.root / "tmp" / "libraries"
        libs.mkdir()
        for lib in ["base", "ssl", "ingress"]:
            shutil.copy(CHART / "libraries" / f"{lib}.yaml", libs / f"{lib}.yaml")
        r = img.run([*img.entrypoint(), "validate", *[a for lib in ["base", "ssl", "ingress"] for a in ("-f", f"/tmp/libraries/{lib}.yaml")]],
                    timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertRegex(r.stdout, r"Tests: [1-9][0-9]* passed, 0 failed")
        self.assertIn("✓ HAProxy accepts the configuration", r.stdout)

    def test_agent_initialises_and_its_haproxy_checks(self):
        img = self.images["haptic-agent"]
        r = img.run([*img.entrypoint(), "--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("haptic-agent serve", r.stdout)
        (img.root / "tmp" / "bootstrap.cfg").write_text(
            "global\n  log stdout format raw local0\n"
            "defaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 1s\n"
            "frontend status\n  bind 127.0.0.1:8404\n  http-request return status 200 if { path_reg ^/(healthz|ready)$ }\n"
        )
        r = img.run([*img.entrypoint(), "init", "--bootstrap", "/tmp/bootstrap.cfg", "--config-dir", "/tmp/config"])
        self.assertEqual(r.returncode, 0, r.stderr)
        r = img.run(["/usr/local/sbin/haproxy", "-c", "-f", "/tmp/config/haproxy.cfg"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # A broken configuration is refused by the same binary.
        (img.root / "tmp" / "broken.cfg").write_text("frontend f\n  bind 127.0.0.1:1\n  use_backend\n")
        self.assertNotEqual(img.run(["/usr/local/sbin/haproxy", "-c", "-f", "/tmp/broken.cfg"]).returncode, 0)

    def test_haproxy_image_serves_tls_and_its_prometheus_exporter(self):
        img = self.images["haptic-haproxy"]
        addr = unique_loopback()
        cert = img.root / "tmp" / "site.pem"
        key = img.root / "tmp" / "site.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=images.test"],
                       check=True, capture_output=True)
        cert.write_text(cert.read_text() + key.read_text())
        os.chmod(cert, 0o644)
        (img.root / "tmp" / "haproxy.cfg").write_text(
            "global\n  log stdout format raw local0\n"
            "defaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 1s\n"
            f"frontend web\n  bind {addr}:8443 ssl crt /tmp/site.pem\n"
            "  http-request return status 200 content-type text/plain string \"tls ok\" if { path_reg ^/hello$ }\n"
            f"frontend stats\n  bind {addr}:8404\n  http-request use-service prometheus-exporter if {{ path /metrics }}\n"
        )
        cfg = img.config["config"]
        env = dict(e.split("=", 1) for e in cfg.get("Env", []))
        proc = subprocess.Popen(
            ["chroot", f"--userspec={cfg['User']}", str(img.root), *img.entrypoint(), "-db", "-f", "/tmp/haproxy.cfg"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection((addr, 8404), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        self.fail(f"haproxy did not start: {proc.stdout.read().decode(errors='replace')}")
                    time.sleep(0.05)
            r = subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert", str(cert), "--resolve", f"images.test:8443:{addr}",
                                "https://images.test:8443/hello"], capture_output=True, text=True, timeout=20)
            self.assertEqual(r.stdout, "tls ok", r.stderr)
            with urllib.request.urlopen(f"http://{addr}:8404/metrics", timeout=10) as resp:
                metrics = resp.read().decode()
            self.assertIn("haproxy_process_", metrics)
            self.assertIn('haproxy_frontend_http_requests_total{proxy="web"}', metrics)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()


if __name__ == "__main__":
    unittest.main()
