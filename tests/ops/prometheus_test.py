#!/usr/bin/env python3
"""A real Prometheus scrapes a real modelstate-server under a small load.

The server runs with --metrics_listen on a free loopback port and
--log_format=json. The load goes through the real client, modelstatectl: a
policy subscriber (an interceptor), a build, a state_dict download and
upload, a lookup that fails. Then:

- one scrape passes `promtool check metrics` (names, types, units, help);
- Debian's prometheus, on another free loopback port with a generated
  config that scrapes the server every second and loads
  deploy/prometheus/alerts.yml, answers /api/v1/query with the expected
  series and values; its /api/v1/rules has every alert rule, healthy; and
  every query of deploy/grafana/modelstate.json runs without error;
- every line the server logged is one JSON object with time, level and
  message, and the failed call's line carries its correlation id.

Exits 77 (ctest SKIP_RETURN_CODE) when the prometheus or promtool binary
is absent.

Usage: prometheus_test.py SERVER_BINARY CLI_BINARY
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import server_process  # noqa: E402  (tests/python/server_process.py)

SERVER_BINARY = CLI_BINARY = None
SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode("utf-8")


def wait_for(what, fn, timeout=60):
    """Calls fn until it returns something truthy; fails after timeout."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except OSError as e:  # not listening yet
            last = e
        time.sleep(0.2)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="modelstate-prom-")
        cls.server = server_process.Server(
            SERVER_BINARY, "--metrics_listen=127.0.0.1:0", "--log_format=json",
            "--scrub_interval=1s")
        cls.metrics_address = wait_for("the metrics address", cls.find_metrics)
        cls.subscriber = None
        cls.prometheus = None
        try:
            cls.load()
            cls.start_prometheus()
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for p in (cls.subscriber, cls.prometheus):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def log_lines(cls):
        cls.server.log.flush()
        with open(os.path.join(cls.server.dir, "server.log")) as f:
            return [line for line in f.read().splitlines() if line]

    @classmethod
    def find_metrics(cls):
        for line in cls.log_lines():
            m = re.search(r"metrics on http://([0-9.:]+)/metrics", line)
            if m:
                return m.group(1)
        return None

    @classmethod
    def cli(cls, *args, check=True):
        return subprocess.run(
            [CLI_BINARY, "--server", cls.server.address] + list(args),
            check=check, capture_output=True, text=True, timeout=60)

    @classmethod
    def load(cls):
        """Traffic of every kind the series below describe."""
        cls.subscriber = subprocess.Popen(
            [CLI_BINARY, "--server", cls.server.address, "subscribe",
             "--policy",
             os.path.join(ROOT, "deploy", "policies",
                          "float32_everything.json")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # The first line says it is subscribed.
        first = cls.subscriber.stdout.readline()
        assert "subscribed" in first, first
        spec = os.path.join(cls.tmp, "mlp.json")
        with open(spec, "w") as f:
            json.dump({"type": "Sequential", "children": [
                {"spec": {"type": "Linear", "args": [64, 32]}},
                {"spec": {"type": "ReLU"}},
                {"spec": {"type": "Linear", "args": [32, 4]}}]}, f)
        state = os.path.join(cls.tmp, "mlp.safetensors")
        cls.cli("build", spec, "--name", "team/mlp", "--seed", "0")
        # Each way once as gRPC messages, once through the shared-memory
        # ring (the CLI's default on the server's host).
        cls.cli("--no-shared-memory", "get-state", "team/mlp", "-o", state)
        cls.cli("--no-shared-memory", "load-state", "team/mlp", state)
        cls.cli("get-state", "team/mlp", "-o", state)
        cls.cli("load-state", "team/mlp", state)
        cls.cli("describe", "team/mlp")
        cls.cli("ls")
        cls.missing = cls.cli("describe", "team/missing", check=False)

    @classmethod
    def start_prometheus(cls):
        cls.prometheus_port = free_port()
        config = os.path.join(cls.tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "rule_files:\n  - %s\n"
                "scrape_configs:\n"
                "  - job_name: modelstate\n"
                "    static_configs:\n"
                "      - targets: ['%s']\n"
                % (os.path.join(ROOT, "deploy", "prometheus", "alerts.yml"),
                   cls.metrics_address))
        cls.prometheus_log = open(os.path.join(cls.tmp, "prometheus.log"), "w")
        cls.prometheus = subprocess.Popen(
            ["prometheus", "--config.file=" + config,
             "--storage.tsdb.path=" + os.path.join(cls.tmp, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % cls.prometheus_port],
            stdout=cls.prometheus_log, stderr=subprocess.STDOUT,
            preexec_fn=server_process._die_with_parent)
        wait_for("prometheus to be ready",
                 lambda: http_get(cls.api("/-/ready"))[0] == 200)

    @classmethod
    def api(cls, path, **params):
        url = "http://127.0.0.1:%d%s" % (cls.prometheus_port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return url

    def query(self, expr):
        status, body = http_get(self.api("/api/v1/query", query=expr))
        reply = json.loads(body)
        self.assertEqual(reply["status"], "success", body)
        return reply["data"]["result"]

    def wait_for_series(self, expr):
        """The series of `expr` once Prometheus has scraped them."""
        return wait_for(expr, lambda: self.query(expr), timeout=30)

    def value(self, expr):
        result = self.wait_for_series(expr)
        self.assertEqual(len(result), 1, result)
        return float(result[0]["value"][1])

    def test_scrape_passes_promtool(self):
        status, text = http_get("http://%s/metrics" % self.metrics_address)
        self.assertEqual(status, 200)
        self.assertIn("# TYPE modelstate_rpcs_total counter", text)
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

    def test_prometheus_has_the_expected_series(self):
        self.assertEqual(self.value('up{job="modelstate"}'), 1)
        self.assertEqual(self.value(
            'modelstate_rpcs_total{method="BuildModule",code="OK"}'), 1)
        self.assertEqual(self.value(
            'modelstate_rpcs_total{method="GetModule",code="NOT_FOUND"}'), 1)
        self.assertGreaterEqual(self.value(
            'modelstate_rpc_duration_seconds_count{method="BuildModule"}'), 1)
        self.assertGreater(self.value(
            'histogram_quantile(0.5, modelstate_rpc_duration_seconds_bucket'
            '{method="GetStateDict"})'), 0)
        # 64*32 + 32 + 32*4 + 4 float32 values went each way, with framing.
        state_bytes = 4 * (64 * 32 + 32 + 32 * 4 + 4)
        self.assertGreater(self.value(
            'modelstate_rpc_sent_bytes_total{method="GetStateDict"}'),
            state_bytes)
        self.assertGreater(self.value(
            'modelstate_rpc_received_bytes_total{method="LoadStateDict"}'),
            state_bytes)
        for direction in ("get", "load"):
            self.assertEqual(self.value(
                'modelstate_shared_memory_bytes_total{direction="%s"}'
                % direction), state_bytes)
        self.assertEqual(self.value(
            'modelstate_open_streams{method="Subscribe"}'), 1)
        self.assertEqual(self.value('modelstate_modules{namespace="team"}'), 1)
        self.assertEqual(self.value(
            'modelstate_hosted_bytes{namespace="team"}'), state_bytes)
        self.assertGreaterEqual(self.value(
            'modelstate_hook_round_trip_seconds_count'
            '{subscriber="float32-everything"}'), 1)
        self.assertEqual(self.value(
            'modelstate_subscriber_queue_depth'
            '{subscriber="float32-everything"}'), 0)
        self.assertEqual(self.value(
            'modelstate_subscriber_queue_bytes'
            '{subscriber="float32-everything"}'), 0)
        self.assertEqual(self.value(
            'modelstate_device_hosted_bytes{namespace="team",device="cpu"}'),
            state_bytes)
        # The scrub runs each second; nothing hosted here is mapped from a
        # data file yet (nothing restarted), so it finds nothing to read.
        self.assertEqual(self.value('modelstate_builds_waiting'), 0)
        self.assertEqual(self.value('modelstate_damaged_storages'), 0)
        self.assertEqual(self.value('modelstate_scrub_bytes_total'), 0)
        self.assertGreaterEqual(self.value('modelstate_scrub_passes_total'), 0)
        self.assertGreater(self.value('process_resident_memory_bytes'), 1e6)
        self.assertGreater(self.value('process_threads'), 2)
        self.assertGreater(self.value('process_open_fds'), 3)
        self.assertGreater(self.value('modelstate_audit_append_seconds_count'),
                           0)
        self.assertGreater(self.value('modelstate_audit_sync_seconds_count'), 0)

    def test_alert_rules_are_loaded_and_healthy(self):
        def rules():
            status, body = http_get(self.api("/api/v1/rules"))
            groups = json.loads(body)["data"]["groups"]
            found = {r["name"]: r for g in groups for r in g["rules"]}
            # Every rule evaluated at least once: a group evaluates its rules
            # one after another, so a snapshot can catch it half way, with
            # the later rules still at health "unknown".
            if any(r.get("lastEvaluation", "0001").startswith("0001")
                   for r in found.values()):
                return None
            return found
        found = wait_for("the alert rules", rules, timeout=30)
        self.assertEqual(sorted(found), [
            "ModelstateAuditSyncSlow", "ModelstateCheckpointStale",
            "ModelstateDataLoss", "ModelstateHookTimeouts",
            "ModelstateQuotaNearlyFull", "ModelstateServerDown"])
        for name, rule in found.items():
            self.assertEqual(rule["health"], "ok", (name, rule))

        # The server is up: once its first scrape is in (before it, absent()
        # holds), the down alert goes back to inactive.
        def server_down_state():
            found = rules()
            if found is None:
                return None
            state = found["ModelstateServerDown"]["state"]
            return state if state == "inactive" else None
        wait_for("ModelstateServerDown to be inactive", server_down_state,
                 timeout=30)

    def test_every_dashboard_query_runs(self):
        with open(os.path.join(ROOT, "deploy", "grafana",
                               "modelstate.json")) as f:
            dashboard = json.load(f)
        exprs = [t["expr"] for p in dashboard["panels"]
                 for t in p.get("targets", [])]
        self.assertGreater(len(exprs), 10)
        for expr in exprs:
            expr = (expr.replace("$__rate_interval", "1m")
                    .replace("$instance", ".*").replace("$job", ".*"))
            self.query(expr)  # asserts status "success"

    def test_log_is_json_with_correlation_ids(self):
        self.assertNotEqual(self.missing.returncode, 0)
        lines = self.log_lines()
        self.assertGreater(len(lines), 2)
        records = [json.loads(line) for line in lines]
        for r in records:
            self.assertEqual(list(r)[:3], ["time", "level", "message"], r)
            self.assertRegex(r["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        failed = [r for r in records
                  if r.get("method") == "GetModule" and
                  r.get("code") == "NOT_FOUND"]
        self.assertEqual(len(failed), 1, records)
        self.assertEqual(failed[0]["level"], "warning")
        # modelstatectl sends no x-request-id: the server made one.
        self.assertRegex(failed[0]["correlation_id"], r"^[0-9a-f]{16}$")


def main():
    global SERVER_BINARY, CLI_BINARY
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    SERVER_BINARY, CLI_BINARY = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            print("SKIP: no %s binary (Debian package prometheus)" % binary)
            sys.exit(SKIP)
    unittest.main()


if __name__ == "__main__":
    main()
