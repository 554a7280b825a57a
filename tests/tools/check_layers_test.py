#!/usr/bin/env python3
"""check_layers.py finds each kind of include README "Layout" rules out:
a layer including a higher one, cluster/ past base, the client side
including the layer library, the service or the server's conversions,
the audit library past base, and a header cycle."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "check_layers.py")


class CheckLayersTest(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="check_layers_")
        self.addCleanup(shutil.rmtree, self.root)
        # A tree that keeps every rule.
        self.files = {
            "base/log.h": [],
            "core/tensor.h": ["base/log.h"],
            "nn/layers.h": ["core/tensor.h"],
            "service/audit_record.h": [],
            "service/audit_log.h": ["base/log.h", "service/audit_record.h"],
            "service/audit_log.cc": ["service/audit_log.h"],
            "service/model_store.h": ["nn/layers.h", "service/audit_log.h"],
            "cluster/etcd_client.h": ["base/log.h"],
            "proto/convert.h": ["core/tensor.h"],
            "proto/service_convert.h": ["proto/convert.h",
                                        "service/model_store.h"],
            "server/server.h": ["proto/service_convert.h",
                                "cluster/etcd_client.h"],
            "client/client.h": ["proto/convert.h", "core/tensor.h"],
            "client/cli/audit.cc": ["client/client.h", "service/audit_log.h"],
        }

    def run_check(self, extra=None):
        files = dict(self.files)
        files.update(extra or {})
        for path, incs in files.items():
            full = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write("".join(f'#include "{i}"\n' for i in incs))
        r = subprocess.run([sys.executable, CHECK, self.root],
                           capture_output=True, text=True)
        return r.returncode, r.stdout

    def assertRefused(self, extra, says):
        code, out = self.run_check(extra)
        self.assertEqual(code, 1, out)
        self.assertIn(says, out)

    def test_a_tree_that_keeps_the_rules_passes(self):
        code, out = self.run_check()
        self.assertEqual(code, 0, out)
        self.assertIn("0 problem(s)", out)

    def test_a_layer_including_a_higher_one(self):
        self.assertRefused({"core/tensor.h": ["nn/layers.h"]},
                           "core/tensor.h includes nn/layers.h")

    def test_cluster_is_base_only(self):
        self.assertRefused({"cluster/etcd_client.h": ["service/model_store.h"]},
                           "cluster/etcd_client.h includes service/")
        self.assertRefused({"cluster/member.cc": ["core/tensor.h"]},
                           "cluster/member.cc includes core/tensor.h")

    def test_the_client_side_links_no_layer_library_and_no_service(self):
        self.assertRefused({"client/client.cc": ["nn/layers.h"]},
                           "client/client.cc includes nn/layers.h")
        self.assertRefused({"client/client.cc": ["service/model_store.h"]},
                           "client/client.cc includes service/model_store.h")
        self.assertRefused({"client/client.cc": ["server/server.h"]},
                           "client/client.cc includes server/server.h")
        self.assertRefused({"client/client.cc": ["proto/service_convert.h"]},
                           "proto/service_convert.h is the server's")
        self.assertRefused({"proto/convert.cc": ["nn/layers.h"]},
                           "proto/convert.cc includes nn/layers.h")

    def test_the_audit_library_is_base_only(self):
        self.assertRefused({"service/audit_log.cc": ["core/tensor.h"]},
                           "the audit library (modelstate_audit) is base only")

    def test_the_server_may_not_include_the_client(self):
        self.assertRefused({"server/server.cc": ["client/client.h"]},
                           "server/server.cc includes client/client.h")

    def test_a_header_cycle(self):
        self.assertRefused({"base/a.h": ["base/b.h"], "base/b.h": ["base/a.h"]},
                           "include cycle")


if __name__ == "__main__":
    unittest.main(verbosity=2)
