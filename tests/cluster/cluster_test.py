#!/usr/bin/env python3
"""A modelstate cluster on a real etcd: Debian's etcd-server on loopback
and three modelstate-server processes that join it (--etcd_endpoints).

Checked through the real Python client's stubs, against every replica:
- placement: modules built through one replica spread over the three (the
  least-loaded member), each owned by exactly one, as etcd and
  GetClusterStatus say;
- forwarding: GetModule, GetStateDict (a stream), LoadStateDict (a client
  stream), SetTraining, Forward and DeleteModule through a replica that
  does not own the module act on the owner, bit for bit;
- ListModules through any replica lists every replica's modules, in pages;
- QueryAudit with `cluster` through any replica merges every replica's
  records in time order, each naming its replica, in pages that together
  hold each record once; `modelstatectl audit query --cluster` too;
- a client that sends a forwarded identity itself is refused
  (UNAUTHENTICATED);
- cluster-wide hooks: a subscriber connected to one replica intercepts the
  registrations of every replica (its verdicts enforced by each owner), in
  one event-id space, each event naming the replica that decided it; its
  replica SIGKILLed while an owner waits for its answer is a disconnect:
  the fail-closed policy blocks the registration at once; a replica that
  restarts takes no write until the subscriber's relay has reached it
  (its home held stopped meanwhile), then its registrations are governed;
- a SIGKILLed replica: its modules answer UNAVAILABLE naming it, the
  others' answer, `modelstatectl audit verify --cluster` fails naming
  it, and a merged audit query names it as left out; a merged watch
  started meanwhile follows it once it is back; after its restart (same volume) its modules are back with the state
  loaded before the kill, and every replica's log checks out against the
  checkpoint it recorded in etcd;
- a replica stopped (SIGSTOP) past its lease accepts no write after it
  resumes until it holds a live lease again; a load routed before etcd went
  silent past the lease is refused at commit, the module unchanged; a
  replica whose id another server took while it was stopped stands down
  (FAILED_PRECONDITION for every call) and leaves the record alone;
- a caller without credentials learns nothing of placement
  (UNAUTHENTICATED even when the owner is gone);
- etcd that stops answering is UNAVAILABLE, as one that is down;
- with a token file, the owner applies the caller's roles to a forwarded
  call and audits it under the caller's identity, not the replica's;
- a second server given a live replica's id is refused at start;
- cluster move (modelstatectl cluster move, through a replica that owns
  neither end): the new owner serves the module bit for bit through every
  replica, etcd names it, the old owner's files are gone, both audited
  their half ("move_out", "move_in"), the new owner restarts with it and
  every log verifies; it moves back; moving to the owner, to a replica
  without a lease, an unplaced module, and ImportModule from a client
  are refused; a copy of a moved module that its old owner's volume still
  holds after a crash is set aside at that replica's restart (kept under
  data/set-aside, audited "set_aside"), never served or listed, even after
  the owner deletes the module;
- etcd restarted: calls about modules fail UNAVAILABLE while it is down
  (no server fails) and work again once it is back;
- etcd with authentication on (--etcd_user, --etcd_password_file): a
  server with the password joins, one with a wrong password does not
  start (its log names the refusal, not a dead endpoint after it); an
  endpoint list whose first endpoint is dead, or busy ("too many
  requests"), still works; a new password is taken on SIGHUP; one etcd
  no longer accepts is UNAVAILABLE to clients, naming the login;
- TLS servers with mutual TLS (certificates made by the openssl command),
  on an etcd that requires client certificates too: replicas reach etcd
  with --etcd_ca_file/--etcd_cert_file/--etcd_key_file (a key or CA others
  may write is refused at start), call each other over TLS, presenting their own certificate and
  trusting --cluster_ca_file; a module read through the replica that does
  not own it matches the owner's bytes, a subscriber on one replica
  rejects a registration on the other, and the owner audits the caller by
  the client certificate's name;
- TLS certificates rotated to a new CA on running replicas (both CAs
  trusted during the roll, then the old dropped), reloaded on SIGHUP: the
  replicas still forward to each other, a bad set (a key not the
  certificate's) is kept out of the calls between replicas and logged;
- etcd's client certificate and CA rolled the same way (etcd restarted to
  trust both CAs, the replicas' --etcd_* files swapped and SIGHUP, etcd
  restarted trusting the new CA alone): the replicas keep their lease and
  membership and forward as before; a bad set is kept out, logged once.

Exits 77 (ctest SKIP_RETURN_CODE) when the etcd binary is absent.

Usage: cluster_test.py SERVER_BINARY CLI_BINARY [unittest arguments]
"""

import glob
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import queue
import tempfile
import threading
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from modelstate.v1 import cluster_pb2  # noqa: E402
from modelstate.v1 import cluster_pb2_grpc  # noqa: E402
from modelstate.v1 import model_state_service_pb2 as pb  # noqa: E402
from modelstate.v1 import module_pb2  # noqa: E402
from modelstate.v1 import model_state_service_pb2_grpc as pb_grpc  # noqa: E402,E501
import server_process  # noqa: E402
from etcd_process import Etcd  # noqa: E402

SERVER_BINARY = CLI_BINARY = None
SKIP = 77
LEASE_SECONDS = 3
TIMEOUT = 20


class Subscriber:
    """A Subscribe stream read on a thread: each event is kept and answered
    with decide(event) (None: left unanswered)."""

    def __init__(self, channel, subscription, decide):
        self.channel = channel
        self.requests = queue.Queue()
        self.requests.put(pb.SubscribeRequest(subscription=subscription))
        self.events = []
        self.error = None
        self.acked = threading.Event()

        def requests():
            while True:
                request = self.requests.get()
                if request is None:
                    return
                yield request
        self.call = pb_grpc.ModelStateServiceStub(self.channel).Subscribe(
            requests())
        self.thread = threading.Thread(target=self.read, args=(decide,),
                                       daemon=True)
        self.thread.start()

    def read(self, decide):
        try:
            for response in self.call:
                if response.HasField("ack"):
                    self.acked.set()
                    continue
                self.events.append(response.event)
                answer = decide(response.event)
                if answer is not None:
                    answer.event_id = response.event.event_id
                    self.requests.put(pb.SubscribeRequest(answer=answer))
        except grpc.RpcError as e:
            self.error = e
        self.acked.set()

    def close(self):
        self.requests.put(None)
        self.call.cancel()
        self.thread.join(TIMEOUT)
        self.channel.close()


class ClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd = Etcd()
        cls.secret_dir = tempfile.mkdtemp(prefix="modelstate-secret-")
        cls.secret = os.path.join(cls.secret_dir, "secret")
        with open(cls.secret, "w") as f:
            f.write("a-cluster-secret-of-some-length\n")
        cls.servers = {}
        for i in range(3):
            replica = "r%d" % i
            cls.servers[replica] = server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + cls.etcd.endpoint,
                "--replica_id=" + replica,
                "--cluster_secret_file=" + cls.secret,
                "--cluster_lease_seconds=%d" % LEASE_SECONDS)
        # A second cluster on the same etcd (its own key prefix) whose
        # servers authenticate callers.
        cls.tokens = {"admin": "admin-token", "alice": "alice-token",
                      "bob": "bob-token"}
        roles = {"admin": {"admin": ["*"]},
                 "alice": {"builder": ["team"], "reader": ["*"]},
                 "bob": {"reader": ["*"]}}
        cls.token_file = os.path.join(cls.secret_dir, "tokens.json")
        # Written 0600 whatever the umask: the server refuses a token file
        # others may write.
        with open(os.open(cls.token_file, os.O_WRONLY | os.O_CREAT, 0o600),
                  "w") as f:
            json.dump({"principals": [
                {"identity": who, "roles": roles[who],
                 "token_sha256": hashlib.sha256(t.encode()).hexdigest()}
                for who, t in cls.tokens.items()]}, f)
        cls.secure = {}
        for i in range(3):
            replica = "s%d" % i
            cls.secure[replica] = server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + cls.etcd.endpoint,
                "--replica_id=" + replica, "--cluster_key_prefix=/secure/",
                "--cluster_secret_file=" + cls.secret,
                "--token_file=" + cls.token_file)

    @classmethod
    def tearDownClass(cls):
        for server in list(cls.servers.values()) + list(cls.secure.values()):
            try:
                server.process.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            server.stop()
        cls.etcd.stop()
        shutil.rmtree(cls.secret_dir, ignore_errors=True)

    def stub(self, replica):
        server = self.servers.get(replica) or self.secure[replica]
        channel = grpc.insecure_channel(server.address)
        self.addCleanup(channel.close)
        return pb_grpc.ModelStateServiceStub(channel)

    def cluster_stub(self, replica):
        channel = grpc.insecure_channel(self.servers[replica].address)
        self.addCleanup(channel.close)
        return cluster_pb2_grpc.ClusterServiceStub(channel)

    def cluster_status(self, replica="r0"):
        return self.cluster_stub(replica).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)

    def etcdctl(self, *args):
        return subprocess.run(
            ["etcdctl", "--endpoints=" + self.etcd.endpoint] + list(args),
            check=True, capture_output=True,
            env=dict(os.environ, ETCDCTL_API="3")).stdout

    def placed(self, module, seed):
        """Builds `module`; returns (its owner, another replica, the owner's
        directory of it)."""
        self.build("r0", module, seed=seed)
        source = self.owners()[module]
        target = [r for r in sorted(self.servers) if r != source][0]
        ns, name = module.split("/")
        return source, target, os.path.join(self.servers[source].dir, "data",
                                            "modules", ns, name)

    def owners(self):
        return {p.module: p.owner for p in self.cluster_status().placements}

    def build(self, via, module, out_features=3, seed=1, metadata=None):
        request = pb.BuildModuleRequest(module=module, seed=seed)
        request.spec.type = "Linear"
        request.spec.args.add().number_value = 4
        request.spec.args.add().number_value = out_features
        return self.stub(via).BuildModule(request, timeout=TIMEOUT,
                                          metadata=metadata)

    def state(self, via, module, metadata=None):
        """The module's state_dict stream, as (header, bytes)."""
        chunks = list(self.stub(via).GetStateDict(
            pb.GetStateDictRequest(module=module), timeout=TIMEOUT,
            metadata=metadata))
        return chunks[0].header, b"".join(c.data for c in chunks[1:])

    def load(self, via, module, header, data, metadata=None):
        def messages():
            start = pb.LoadStateDictRequest()
            start.start.module = module
            start.start.header.CopyFrom(header)
            yield start
            for i in range(0, len(data), 7):  # many small messages
                yield pb.LoadStateDictRequest(data=data[i:i + 7])
        return self.stub(via).LoadStateDict(messages(), timeout=TIMEOUT,
                                            metadata=metadata)

    def cli(self, via, *args):
        return subprocess.run(
            [CLI_BINARY, "--server=" + self.servers[via].address] +
            list(args), capture_output=True, text=True, timeout=60)

    def test_1_placement_spreads_modules_and_each_has_one_owner(self):
        for i in range(6):
            self.build("r0", "place/m%d" % i)
        owners = {m: o for m, o in self.owners().items()
                  if m.startswith("place/")}
        self.assertEqual(len(owners), 6)
        counts = {r: list(owners.values()).count(r) for r in self.servers}
        self.assertEqual(counts, {"r0": 2, "r1": 2, "r2": 2}, owners)
        status = self.cluster_status("r1")
        self.assertEqual(status.replica, "r1")
        self.assertEqual(sorted(m.replica for m in status.members),
                         ["r0", "r1", "r2"])
        for member in status.members:
            self.assertEqual(member.address,
                             self.servers[member.replica].address)
            self.assertGreater(member.lease_ttl_seconds, 0)
        # Building an existing module through any replica reaches its owner.
        with self.assertRaises(grpc.RpcError) as e:
            self.build("r2", "place/m0")
        self.assertEqual(e.exception.code(), grpc.StatusCode.ALREADY_EXISTS)

    def subscribe(self, replica, subscription, decide):
        subscriber = Subscriber(
            grpc.insecure_channel(self.servers[replica].address),
            subscription, decide)
        self.addCleanup(subscriber.close)
        self.assertTrue(subscriber.acked.wait(TIMEOUT))
        self.assertIsNone(subscriber.error)
        return subscriber

    def test_9a_a_subscriber_sees_every_replicas_registrations(self):
        home = "r1"

        def no_biases(event):
            if event.name == "bias":
                return pb.HookAnswer(verdict=pb.HookAnswer.REJECT,
                                     reason="no biases")
            return pb.HookAnswer(verdict=pb.HookAnswer.APPROVE)
        subscriber = self.subscribe(home, pb.Subscription(
            name="policy", namespaces=["hooks"], timeout_ms=20000), no_biases)
        # Built through r0 until every replica owns one (least loaded).
        owners = {}
        for i in range(15):
            module = "hooks/m%d" % i
            response = self.build("r0", module, seed=i)
            outcome = {r.name: r for r in response.registrations}
            self.assertEqual(outcome["weight"].outcome, module_pb2.OUTCOME_KEEP)
            self.assertEqual(outcome["bias"].outcome, module_pb2.OUTCOME_BLOCK)
            self.assertIn("no biases", outcome["bias"].reason)
            owners[module] = self.owners()[module]
            if set(owners.values()) == set(self.servers):
                break
        self.assertEqual(set(owners.values()), set(self.servers))
        events = list(subscriber.events)
        self.assertEqual(len(events), 2 * len(owners))
        self.assertEqual(len({e.event_id for e in events}), len(events))
        for e in events:
            self.assertEqual(e.replica, owners[e.namespace + "/" + e.module], e)
            if e.replica == home:
                self.assertEqual(e.event_id, e.replica_event_id)
            else:
                self.assertEqual(e.event_id >> 63, 1)
                self.assertEqual(e.event_id & (2**40 - 1), e.replica_event_id)
        # Each owner's audit log holds the subscriber's rejection.
        for module, owner in owners.items():
            ns, name = module.split("/")
            records = self.stub(owner).QueryAudit(pb.QueryAuditRequest(
                filter=pb.AuditFilter(namespace=ns, module=name), limit=1000),
                timeout=TIMEOUT).records
            text = " ".join(str(r) for r in records)
            self.assertIn("policy", text)
            self.assertIn("no biases", text)
        # A replica that restarts is subscribed to again (a new relay
        # connection), and its registrations reach the subscriber once more.
        module, victim = next((m, o) for m, o in owners.items() if o != home)
        self.servers[victim].kill()
        self.servers[victim].start()

        def relayed_again():
            names = [s.subscription.name for s in self.stub(victim)
                     .ListSubscribers(pb.ListSubscribersRequest(),
                                      timeout=TIMEOUT).subscribers]
            return "policy" in names
        self.wait_until("the relay to reach the restarted replica",
                        relayed_again)
        seen = len(subscriber.events)
        self.stub(home).RegisterSubmodule(pb.RegisterSubmoduleRequest(
            module=module, name="later", none=True), timeout=TIMEOUT)
        later = subscriber.events[seen:]
        self.assertEqual([(e.replica, e.name) for e in later],
                         [(victim, "later")])
        before = {e.event_id >> 40 for e in events if e.replica == victim}
        self.assertNotIn(later[0].event_id >> 40, before)

    def test_9b_a_subscribers_replica_dying_is_a_disconnect(self):
        self.build("r0", "dying/m")
        owner = self.owners()["dying/m"]
        home = next(r for r in sorted(self.servers) if r != owner)
        delivered = threading.Event()
        self.subscribe(home, pb.Subscription(
            name="silent", namespaces=["dying"], timeout_ms=60000,
            failure_policy=pb.Subscription.FAIL_CLOSED),
            lambda event: delivered.set())  # never answers
        result = {}

        def register():
            try:
                result["response"] = self.stub(owner).RegisterSubmodule(
                    pb.RegisterSubmoduleRequest(module="dying/m",
                                                name="extra", none=True),
                    timeout=TIMEOUT)
            except grpc.RpcError as e:
                result["error"] = e
        call = threading.Thread(target=register)
        call.start()
        self.assertTrue(delivered.wait(TIMEOUT), "the event reached the "
                        "subscriber through its replica")
        killed = time.time()
        self.servers[home].kill()
        call.join(TIMEOUT)
        self.assertLess(time.time() - killed, 15, "far within the subscriber's "
                        "60 s timeout")
        self.assertNotIn("response", result)
        self.assertEqual(result["error"].code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("subscriber silent disconnected (fail-closed)",
                      result["error"].details())
        self.servers[home].start()
        self.wait_until("the replica to be back", lambda: home in [
            m.replica for m in self.cluster_status(owner).members])

    def test_2_every_module_call_is_forwarded_to_the_owner(self):
        module = "fwd/lin"
        self.build("r0", module, seed=7)
        owner = self.owners()[module]
        other = next(r for r in sorted(self.servers) if r != owner)
        # The owner's bytes, read directly, and through another replica.
        header, data = self.state(owner, module)
        header2, data2 = self.state(other, module)
        self.assertEqual(data, data2)
        self.assertEqual([e.key for e in header.entries],
                         [e.key for e in header2.entries])
        info = self.stub(other).GetModule(pb.GetModuleRequest(module=module),
                                          timeout=TIMEOUT)
        self.assertEqual(info.info.type, "Linear")
        # A load through another replica changes the owner's state.
        new = bytes((b + 1) % 256 for b in data)
        response = self.load(other, module, header, new)
        self.assertEqual(list(response.missing_keys), [])
        self.assertTrue(response.audit_seqs, "the owner's audit records")
        self.assertEqual(self.state(owner, module)[1], new)
        # Unary writes and Forward.
        self.stub(other).SetTraining(
            pb.SetTrainingRequest(module=module, training=False),
            timeout=TIMEOUT)
        request = pb.ForwardRequest(module=module)
        x = request.inputs.add()
        x.dtype = header.entries[0].dtype
        x.shape.extend([1, 4])
        x.data = struct.pack("<4f", 1, 2, 3, 4)
        direct = self.stub(owner).Forward(request, timeout=TIMEOUT)
        forwarded = self.stub(other).Forward(request, timeout=TIMEOUT)
        self.assertEqual(direct.outputs[0].data, forwarded.outputs[0].data)
        # Deleted through another replica: gone everywhere, and its name
        # free to be placed again.
        self.stub(other).DeleteModule(pb.DeleteModuleRequest(module=module),
                                      timeout=TIMEOUT)
        self.assertNotIn(module, self.owners())
        for replica in self.servers:
            with self.assertRaises(grpc.RpcError) as e:
                self.stub(replica).GetModule(
                    pb.GetModuleRequest(module=module), timeout=TIMEOUT)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_3_list_modules_merges_every_replica(self):
        for i in range(5):
            self.build("r1", "list/m%d" % i)
        self.assertEqual(len(set(o for m, o in self.owners().items()
                                 if m.startswith("list/"))), 3)
        for via in self.servers:
            names, token = [], ""
            while True:
                page = self.stub(via).ListModules(pb.ListModulesRequest(
                    namespace="list", page_size=2, page_token=token),
                    timeout=TIMEOUT)
                self.assertLessEqual(len(page.modules), 2)
                names += [m.module for m in page.modules]
                token = page.next_page_token
                if not token:
                    break
            self.assertEqual(names, ["list/m%d" % i for i in range(5)], via)

    def test_9d_a_replica_that_joins_waits_for_the_relays(self):
        self.build("r0", "gate/m")
        owner = self.owners()["gate/m"]
        home = next(r for r in sorted(self.servers) if r != owner)

        def guard(event):
            if event.name == "forbidden":
                return pb.HookAnswer(verdict=pb.HookAnswer.REJECT,
                                     reason="not this name")
            return pb.HookAnswer(verdict=pb.HookAnswer.APPROVE)
        self.subscribe(home, pb.Subscription(
            name="gatekeeper", namespaces=["gate"], timeout_ms=20000), guard)

        def register():
            return self.stub(owner).RegisterSubmodule(
                pb.RegisterSubmoduleRequest(module="gate/m", name="forbidden",
                                            none=True), timeout=TIMEOUT)
        # The owner restarts while the subscriber's home is stopped (for
        # less than its lease, so its record stays): no relay can reach the
        # owner, which must refuse writes rather than take them ungoverned.
        self.servers[owner].kill()
        stopped = time.time()
        self.servers[home].process.send_signal(signal.SIGSTOP)
        try:
            self.servers[owner].start()
            with self.assertRaises(grpc.RpcError) as e:
                register()
            within_lease = time.time() - stopped < LEASE_SECONDS - 0.5
        finally:
            self.servers[home].process.send_signal(signal.SIGCONT)
        if within_lease:  # else the home's record may have lapsed meanwhile
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("gatekeeper (connected to %s)" % home,
                          e.exception.details())
        # Once the relay is there, the registration is the subscriber's to
        # decide: rejected.

        def governed():
            try:
                register()
                self.fail("the registration went through ungoverned")
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    return False
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("not this name", e.details())
                return True
        self.wait_until("the relay to reach the restarted owner", governed)

    def test_9c_audit_queries_merge_every_replica(self):
        for i in range(6):
            self.build("r0", "merged/m%d" % i, seed=i)
        owners = self.owners()

        def query(**kwargs):
            return self.stub("r2").QueryAudit(pb.QueryAuditRequest(
                filter=pb.AuditFilter(namespace="merged"), cluster=True,
                **kwargs), timeout=TIMEOUT)
        whole = query(limit=1000)
        self.assertEqual(sorted(whole.replicas), sorted(self.servers))
        self.assertEqual(dict(whole.next_after_seqs), {})
        builds = [r for r in whole.records if r.type == "build"]
        self.assertEqual(sorted(r.module for r in builds),
                         ["m%d" % i for i in range(6)])
        for r in whole.records:
            self.assertEqual(r.replica, owners["merged/" + r.module], r)
        self.assertEqual(len({r.replica for r in builds}), 3)
        times = [r.time for r in whole.records]
        self.assertEqual(times, sorted(times))
        # Pages of 2: every record once, in the same order.
        paged, after = [], {}
        for _ in range(len(whole.records) + 1):
            page = query(limit=2, after_seqs=after)
            self.assertLessEqual(len(page.records), 2)
            paged.extend(page.records)
            if not page.next_after_seqs:
                break
            after = dict(page.next_after_seqs)
        self.assertEqual([(r.replica, r.seq) for r in paged],
                         [(r.replica, r.seq) for r in whole.records])
        # The CLI pages through the same, each line led by its replica.
        out = self.cli("r1", "audit", "query", "--cluster", "--namespace",
                       "merged")
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), len(whole.records))
        self.assertEqual([line.split()[0] for line in lines],
                         [r.replica for r in whole.records])
        # `audit tail --cluster` follows every replica's log as it grows:
        # started first, it sees builds placed on each of the three.
        tail = subprocess.Popen(
            [CLI_BINARY, "--server=" + self.servers["r1"].address, "audit",
             "tail", "--cluster", "--namespace", "tailed", "--type", "build",
             "--limit", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.addCleanup(tail.kill)
        for i in range(6):
            self.build("r0", "tailed/m%d" % i, seed=i)
        out, err = tail.communicate(timeout=TIMEOUT)
        self.assertEqual(tail.returncode, 0, err)
        owners = self.owners()
        tailed = [line.split() for line in out.splitlines()]
        self.assertEqual(len(tailed), 6, out)
        self.assertEqual(sorted((line[0], line[5])
                                for line in tailed),
                         sorted((owners["tailed/m%d" % i], "tailed/m%d" % i)
                                for i in range(6)))

    def test_4_a_client_cannot_forward_an_identity(self):
        self.build("r0", "forge/m")
        stub = self.stub("r0")
        for metadata in ([("x-modelstate-forwarded-peer", "ipv4:10.0.0.1:1")],
                         [("x-modelstate-forwarded-cn", "admin")],
                         [("x-modelstate-replica-secret", "guess-guess-guess"),
                          ("x-modelstate-forwarded-peer", "ipv4:10.0.0.1:1")]):
            with self.assertRaises(grpc.RpcError) as e:
                stub.ListModules(pb.ListModulesRequest(), metadata=metadata,
                                 timeout=TIMEOUT)
            self.assertEqual(e.exception.code(),
                             grpc.StatusCode.UNAUTHENTICATED, metadata)
            self.assertIn("x-modelstate-forwarded-peer",
                          e.exception.details())

    def wait_until(self, what, fn, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if fn():
                return
            time.sleep(0.2)
        self.fail("timed out waiting for " + what)

    def test_5_a_killed_replica_answers_unavailable_and_comes_back(self):
        for i in range(3):
            self.build("r0", "kill/m%d" % i, seed=i)
        owners = self.owners()
        victim = owners["kill/m0"]
        survivor = next(r for r in sorted(self.servers) if r != victim)
        before = {m: self.state(survivor, m)[1] for m in owners
                  if m.startswith("kill/")}
        self.servers[victim].kill()
        self.wait_until("the victim's lease to lapse", lambda: victim not in [
            m.replica for m in self.cluster_status(survivor).members])
        for module, owner in owners.items():
            if not module.startswith("kill/"):
                continue
            if owner == victim:
                with self.assertRaises(grpc.RpcError) as e:
                    self.state(survivor, module)
                self.assertEqual(e.exception.code(),
                                 grpc.StatusCode.UNAVAILABLE)
                self.assertIn("replica " + victim, e.exception.details())
            else:
                self.assertEqual(self.state(survivor, module)[1],
                                 before[module])
        down = self.cli(survivor, "audit", "verify", "--cluster")
        self.assertEqual(down.returncode, 1, down.stdout + down.stderr)
        self.assertIn(victim + ": FAILED: no live lease", down.stdout)
        # A merged query names the replica it had to leave out.
        merged = self.stub(survivor).QueryAudit(
            pb.QueryAuditRequest(cluster=True, limit=1), timeout=TIMEOUT)
        self.assertNotIn(victim, merged.replicas)
        self.assertEqual(list(merged.missing_replicas), [victim])
        query = self.cli(survivor, "audit", "query", "--cluster", "--limit",
                         "1")
        self.assertEqual(query.returncode, 0, query.stderr)
        self.assertIn("warning: left out (no live lease): " + victim,
                      query.stderr)
        # A merged watch started now takes the victim in once it is back.
        watch_channel = grpc.insecure_channel(self.servers[survivor].address)
        self.addCleanup(watch_channel.close)
        watch = pb_grpc.ModelStateServiceStub(watch_channel).WatchAudit(
            pb.WatchAuditRequest(cluster=True, filter=pb.AuditFilter(
                namespace="kill", type="set_training")), timeout=60)
        self.addCleanup(watch.cancel)
        seen = queue.Queue()

        def drain():
            try:
                for record in watch:
                    seen.put(record)
            except grpc.RpcError:
                pass  # cancelled at the end of the test
        threading.Thread(target=drain, daemon=True).start()
        # Back with its volume: everything it owned answers, unchanged.
        self.servers[victim].start()
        for module in before:
            self.assertEqual(self.state(survivor, module)[1], before[module])
        self.wait_until("the watch to follow the victim", lambda: victim in [
            m.replica for m in self.cluster_status(survivor).members])
        time.sleep(1.5)  # the watch looks for joined members every second
        self.stub(survivor).SetTraining(
            pb.SetTrainingRequest(module="kill/m0", training=False),
            timeout=TIMEOUT)
        record = seen.get(timeout=TIMEOUT)
        self.assertEqual((record.replica, record.module, record.type),
                         (victim, "m0", "set_training"))
        # Every replica's log extends the checkpoint it recorded in etcd.
        up = self.cli(survivor, "audit", "verify", "--cluster")
        self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
        lines = up.stdout.splitlines()
        self.assertEqual([line.split(":")[0] for line in lines],
                         sorted(self.servers), up.stdout)
        for line in lines:
            self.assertRegex(line, r"^r\d: ok: \d+ records; the tree of "
                             r"size \d+ extends the checkpoint in etcd")
        status = self.cli(survivor, "cluster", "status")
        self.assertEqual(status.returncode, 0, status.stderr)
        for module, owner in owners.items():
            self.assertRegex(status.stdout, module + r" +" + owner)

    def test_6_a_stopped_replica_takes_no_write_after_its_lease(self):
        self.build("r0", "stop/m")
        owner = self.owners()["stop/m"]
        process = self.servers[owner].process
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(LEASE_SECONDS + 2)
        finally:
            process.send_signal(signal.SIGCONT)
        # The first write it sees after resuming: refused, or accepted only
        # once it has renewed (a new lease, its record back in etcd).
        try:
            self.stub(owner).SetTraining(
                pb.SetTrainingRequest(module="stop/m", training=False),
                timeout=TIMEOUT)
            accepted = True
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("lease", e.details())
            accepted = False
        if accepted:
            self.assertIn(owner, [m.replica for m in
                                  self.cluster_status(owner).members])
        self.wait_until("the replica to be back", lambda: owner in [
            m.replica for m in self.cluster_status("r0").members])
        self.stub(owner).SetTraining(
            pb.SetTrainingRequest(module="stop/m", training=True),
            timeout=TIMEOUT)

    def test_6b_a_write_that_outlasts_the_lease_is_not_committed(self):
        # A load routed while the owner's lease was live, finished after
        # etcd went silent for longer than the lease: the owner checks its
        # lease again at commit, and refuses it with the module unchanged.
        self.build("r0", "fence/m")
        owner = self.owners()["fence/m"]
        header, data = self.state(owner, "fence/m")
        zeros = bytes(len(data))
        sent = threading.Event()
        go_on = threading.Event()

        def messages():
            start = pb.LoadStateDictRequest()
            start.start.module = "fence/m"
            start.start.header.CopyFrom(header)
            yield start
            sent.set()
            go_on.wait(30)
            yield pb.LoadStateDictRequest(data=zeros)
        result = {}

        def load():
            try:
                self.stub(owner).LoadStateDict(messages(), timeout=60)
                result["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                result["code"], result["details"] = e.code(), e.details()
        loader = threading.Thread(target=load)
        loader.start()
        self.assertTrue(sent.wait(TIMEOUT))
        time.sleep(0.5)  # the start reached the owner and was routed
        self.etcd.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(LEASE_SECONDS + 2)
            go_on.set()
            loader.join(TIMEOUT)
        finally:
            self.etcd.process.send_signal(signal.SIGCONT)
        self.assertEqual(result.get("code"), grpc.StatusCode.UNAVAILABLE,
                         result)
        self.assertIn("lease", result["details"])

        def unchanged():
            try:
                return self.state(owner, "fence/m")[1] == data
            except grpc.RpcError:
                return False
        self.wait_until("the owner to answer with the old state", unchanged)

        # Every replica's lease lapsed meanwhile: wait for writes again.
        def writable():
            try:
                self.stub(owner).SetTraining(
                    pb.SetTrainingRequest(module="fence/m", training=True),
                    timeout=TIMEOUT)
                self.build("s0", "probe/after-fence",
                           metadata=self.as_("admin"))
                self.stub("s0").DeleteModule(
                    pb.DeleteModuleRequest(module="probe/after-fence"),
                    timeout=TIMEOUT, metadata=self.as_("admin"))
                return True
            except grpc.RpcError:
                return False
        self.wait_until("writes to be taken again", writable)

    def as_(self, who):
        return [("authorization", "Bearer " + self.tokens[who])]

    def test_7_the_owner_applies_the_callers_roles(self):
        self.build("s0", "team/a", metadata=self.as_("alice"))
        self.build("s0", "team/b", metadata=self.as_("alice"))
        owners = {}
        for replica in self.secure:
            channel = grpc.insecure_channel(self.secure[replica].address)
            self.addCleanup(channel.close)
            status = cluster_pb2_grpc.ClusterServiceStub(
                channel).GetClusterStatus(
                    cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT,
                    metadata=self.as_("admin"))
            owners = {p.module: p.owner for p in status.placements}
        self.assertEqual(set(owners), {"team/a", "team/b"})
        module = "team/a"
        owner = owners[module]
        other = next(r for r in sorted(self.secure) if r != owner)
        # Only an admin may ask for the cluster's status.
        with self.assertRaises(grpc.RpcError) as e:
            channel = grpc.insecure_channel(self.secure[other].address)
            self.addCleanup(channel.close)
            cluster_pb2_grpc.ClusterServiceStub(channel).GetClusterStatus(
                cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT,
                metadata=self.as_("alice"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        # bob reads through another replica, but may not load or delete.
        header, data = self.state(other, module, metadata=self.as_("bob"))
        with self.assertRaises(grpc.RpcError) as e:
            self.load(other, module, header, data, metadata=self.as_("bob"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        with self.assertRaises(grpc.RpcError) as e:
            self.stub(other).DeleteModule(pb.DeleteModuleRequest(
                module=module), timeout=TIMEOUT, metadata=self.as_("bob"))
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED)
        # No credentials at all: refused by the owner too.
        with self.assertRaises(grpc.RpcError) as e:
            self.state(other, module)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        # alice's load through another replica is audited on the owner
        # under her name.
        response = self.load(other, module, header, data,
                             metadata=self.as_("alice"))
        self.assertTrue(response.audit_seqs)
        records = self.stub(owner).QueryAudit(
            pb.QueryAuditRequest(after_seq=response.audit_seqs[0] - 1,
                                 limit=1),
            timeout=TIMEOUT, metadata=self.as_("admin")).records
        self.assertEqual(records[0].seq, response.audit_seqs[0])
        self.assertEqual(records[0].identity, "alice")
        self.assertEqual(records[0].namespace + "/" + records[0].module,
                         module)

    def test_7b_no_credentials_learn_nothing_of_placement(self):
        # Authenticated before routing: with the owner gone, a caller
        # without credentials gets UNAUTHENTICATED, as for a module that
        # does not exist, not UNAVAILABLE naming the owner.
        self.build("s0", "team/where", metadata=self.as_("alice"))
        channel = grpc.insecure_channel(self.secure["s0"].address)
        self.addCleanup(channel.close)
        owners = {p.module: p.owner for p in cluster_pb2_grpc.ClusterServiceStub(
            channel).GetClusterStatus(cluster_pb2.GetClusterStatusRequest(),
                                      timeout=TIMEOUT,
                                      metadata=self.as_("admin")).placements}
        owner = owners["team/where"]
        other = next(r for r in sorted(self.secure) if r != owner)
        process = self.secure[owner].process
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(LEASE_SECONDS + 2)
            for module in ("team/where", "team/nowhere"):
                with self.assertRaises(grpc.RpcError) as e:
                    self.stub(other).GetModule(
                        pb.GetModuleRequest(module=module), timeout=TIMEOUT)
                self.assertEqual(e.exception.code(),
                                 grpc.StatusCode.UNAUTHENTICATED, module)
        finally:
            process.send_signal(signal.SIGCONT)

    def test_8_a_second_server_with_a_live_replicas_id_is_refused(self):
        with self.assertRaises(RuntimeError):
            server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + self.etcd.endpoint,
                "--replica_id=r0", "--cluster_secret_file=" + self.secret)

    def test_9_etcd_restarted(self):
        self.build("r0", "etcd/m")
        before = self.state("r1", "etcd/m")[1]
        self.etcd.process.kill()
        self.etcd.process.wait()
        with self.assertRaises(grpc.RpcError) as e:
            self.state("r1", "etcd/m")
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("etcd", e.exception.details())
        self.etcd.start()

        def answers():
            try:
                return self.state("r1", "etcd/m")[1] == before
            except grpc.RpcError:
                return False
        self.wait_until("the cluster to answer again", answers)
        for replica, server in self.servers.items():
            self.assertIsNone(server.process.poll(), replica)


    def test_9g_a_replica_whose_id_was_taken_meanwhile_stands_down(self):
        # Stopped past its lease, a replica's id is taken by a second server
        # (another volume). Resumed, it must not take the id back: it serves
        # nothing, and the member record stays the second server's.
        flags = ["--etcd_endpoints=" + self.etcd.endpoint,
                 "--replica_id=twin", "--cluster_key_prefix=/twins/",
                 "--cluster_secret_file=" + self.secret,
                 "--cluster_lease_seconds=%d" % LEASE_SECONDS]
        first = server_process.Server(SERVER_BINARY, *flags)
        self.addCleanup(first.stop)
        first.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(LEASE_SECONDS + 2)
            second = server_process.Server(SERVER_BINARY, *flags)
            self.addCleanup(second.stop)
        finally:
            first.process.send_signal(signal.SIGCONT)
        channel = grpc.insecure_channel(first.address)
        self.addCleanup(channel.close)

        def stood_down():
            try:
                pb_grpc.ModelStateServiceStub(channel).GetModule(
                    pb.GetModuleRequest(module="twin/m"), timeout=TIMEOUT)
            except grpc.RpcError as e:
                return (e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                        "replaced by another server" in e.details())
            return False
        self.wait_until("the first server to stand down", stood_down)
        channel2 = grpc.insecure_channel(second.address)
        self.addCleanup(channel2.close)
        members = cluster_pb2_grpc.ClusterServiceStub(
            channel2).GetClusterStatus(cluster_pb2.GetClusterStatusRequest(),
                                       timeout=TIMEOUT).members
        self.assertEqual([(m.replica, m.address) for m in members],
                         [("twin", second.address)])
        request = pb.BuildModuleRequest(module="twin/m", seed=1)
        request.spec.type = "ReLU"
        pb_grpc.ModelStateServiceStub(channel2).BuildModule(
            request, timeout=TIMEOUT)

    def test_9h_a_silent_etcd_is_unavailable(self):
        # etcd that stops answering (a partition) is UNAVAILABLE like one
        # that refuses connections, not the caller's DEADLINE_EXCEEDED.
        self.build("r0", "silent/m")
        self.etcd.process.send_signal(signal.SIGSTOP)
        try:
            with self.assertRaises(grpc.RpcError) as e:
                self.stub("r1").GetModule(
                    pb.GetModuleRequest(module="silent/m"), timeout=TIMEOUT)
        finally:
            self.etcd.process.send_signal(signal.SIGCONT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("etcd", e.exception.details())

        def answers():
            try:
                self.stub("r1").GetModule(
                    pb.GetModuleRequest(module="silent/m"), timeout=TIMEOUT)
                return True
            except grpc.RpcError:
                return False
        self.wait_until("the cluster to answer again", answers)

    def audit_of(self, replica, type_, module):
        request = pb.QueryAuditRequest(limit=100)
        request.filter.type = type_
        return [r for r in self.stub(replica).QueryAudit(
            request, timeout=TIMEOUT).records
            if r.namespace + "/" + r.module == module]

    def test_9e_cluster_move_hands_a_module_to_another_replica(self):
        module = "move/m"
        self.build("r0", module, out_features=5, seed=7)
        header, data = self.state("r0", module)
        # Give it state of its own, so the move carries more than the build.
        data = bytes(b ^ 0x5A for b in data)
        self.load("r0", module, header, data)
        source = self.owners()[module]
        target, via = [r for r in sorted(self.servers) if r != source]
        attested = self.stub(source).AttestModule(
            pb.AttestModuleRequest(module=module), timeout=TIMEOUT)
        envelope = os.path.join(self.servers[source].dir, "m.dsse.json")
        with open(envelope, "w") as f:
            f.write(attested.envelope)
        source_dir = os.path.join(self.servers[source].dir, "data",
                                  "modules", "move", "m")
        self.assertTrue(os.path.isdir(source_dir))
        # Through a replica that owns neither end: passed to the owner.
        moved = self.cli(via, "cluster", "move", module, target)
        self.assertEqual(moved.returncode, 0, moved.stdout + moved.stderr)
        self.assertRegex(moved.stdout, "^moved %s from %s to %s \\(" % (
            module, source, target))
        self.assertEqual(self.owners()[module], target)
        for replica in self.servers:
            self.assertEqual(self.state(replica, module)[1], data, replica)
        # The old owner's copy is gone, files included.
        self.wait_until("the old copy's files to go", lambda: not (
            os.path.exists(source_dir) and os.listdir(source_dir)))
        # Each end audited its half, naming the other.
        out = self.audit_of(source, "move_out", module)
        self.assertEqual(len(out), 1)
        self.assertEqual(json.loads(out[0].details_json)["to_replica"], target)
        into = self.audit_of(target, "move_in", module)
        self.assertEqual(len(into), 1)
        self.assertEqual(json.loads(into[0].details_json)["from_replica"],
                         source)
        self.assertEqual(json.loads(into[0].details_json)["bytes"],
                         json.loads(out[0].details_json)["bytes"])
        # Writes reach the new owner, through the old one too.
        self.stub(source).SetTraining(
            pb.SetTrainingRequest(module=module, training=False),
            timeout=TIMEOUT)
        # The new owner's saved state is its own: it restarts with it.
        self.servers[target].kill()
        self.servers[target].start()
        self.assertEqual(self.state(via, module)[1], data)
        up = self.cli(via, "audit", "verify", "--cluster")
        self.assertEqual(up.returncode, 0, up.stdout + up.stderr)
        # And it moves back.
        back = self.cli(target, "cluster", "move", module, source, "--json")
        self.assertEqual(back.returncode, 0, back.stdout + back.stderr)
        self.assertEqual(json.loads(back.stdout)["to_replica"], source)
        self.assertEqual(self.owners()[module], source)
        self.assertEqual(self.state(target, module)[1], data)
        # Same bytes, same replica: but it lived where this log cannot see
        # (deleted and built again there, perhaps), so the attestation made
        # before the moves does not vouch for the module now.
        verified = self.cli(source, "verify-attestation", envelope,
                            "--key", attested.verifier_key,
                            "--module", module, "--online")
        self.assertEqual(verified.returncode, 1,
                         verified.stdout + verified.stderr)
        self.assertIn("digests: 2 entries match module " + module,
                      verified.stdout)
        self.assertRegex(verified.stdout,
                         "FAILED: module: %s moved to another replica "
                         "\\(audit record [0-9]+\\) after the attested "
                         "records end" % module)

    def test_9f_cluster_move_refuses_what_it_cannot_do(self):
        self.build("r0", "move/n")
        owner = self.owners()["move/n"]
        cluster = self.cluster_stub("r1")

        def move(module, replica):
            with self.assertRaises(grpc.RpcError) as e:
                cluster.MoveModuleToReplica(
                    cluster_pb2.MoveModuleToReplicaRequest(
                        module=module, replica=replica), timeout=TIMEOUT)
            return e.exception
        e = move("move/n", owner)
        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("already on replica " + owner, e.details())
        e = move("move/absent", "r0")
        self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
        e = move("move/n", "nobody")
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("replica nobody holds no live lease", e.details())
        e = move("move/n", "")
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("replica", e.details())
        # The receiving half is for replicas only.
        header = cluster_pb2.ImportModuleRequest()
        header.header.module = "move/forged"
        header.header.from_replica = owner
        header.header.files.add(name="manifest.json", bytes=2)
        with self.assertRaises(grpc.RpcError) as e:
            cluster.ImportModule(iter([header, cluster_pb2.ImportModuleRequest(
                data=b"{}")]), timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        # Nothing moved.
        self.assertEqual(self.owners()["move/n"], owner)

    def after_restart(self, what, call):
        """What call() returns once no channel to a killed process answers
        UNAVAILABLE any more (it may, once); another error's code."""
        result = []

        def attempt():
            try:
                result.append(call())
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    return False
                result.append(e.code())
            return True
        self.wait_until(what, attempt)
        return result[0]

    def move_keeping_a_copy(self, module, seed):
        """Builds `module`, keeps a copy of its owner's directory aside and
        moves it to another replica; returns (old owner, new owner, the old
        owner's module directory, the kept copy)."""
        source, target, source_dir = self.placed(module, seed)
        kept = os.path.join(self.servers[source].dir,
                            "kept-" + module.split("/")[0])
        shutil.copytree(source_dir, kept)
        moved = self.cli(source, "cluster", "move", module, target)
        self.assertEqual(moved.returncode, 0, moved.stdout + moved.stderr)
        self.wait_until("the old copy's files to go", lambda: not (
            os.path.exists(source_dir) and os.listdir(source_dir)))
        return source, target, source_dir, kept

    def test_9i_a_copy_left_by_a_crashed_move_is_set_aside(self):
        # The old owner crashes after the new owner took the module over
        # but before it deleted its own copy: its volume then holds the
        # module as it was before the move (kept aside here, put back
        # while it is down).
        module = "stale/m"
        source, target, source_dir, kept = self.move_keeping_a_copy(
            module, seed=11)
        header, data = self.state(target, module)
        # A write at the new owner: the copy no longer matches it.
        changed = bytes(b ^ 0x33 for b in data)
        self.load(target, module, header, changed)
        self.servers[source].kill()
        shutil.rmtree(source_dir, ignore_errors=True)
        shutil.copytree(kept, source_dir)
        self.servers[source].start()
        # Not served, not listed twice: every read reaches the owner.
        self.assertEqual(self.owners()[module], target)
        for replica in self.servers:
            self.assertEqual(self.state(replica, module)[1], changed, replica)
        names = [m.module for m in self.stub(source).ListModules(
            pb.ListModulesRequest(namespace="stale"), timeout=TIMEOUT).modules]
        self.assertEqual(names, [module])
        # Its files are kept for an operator, out of the modules directory,
        # and the replica audited what it did.
        self.assertFalse(os.path.exists(source_dir))
        aside = os.path.join(self.servers[source].dir, "data", "set-aside",
                             "stale")
        copies = os.listdir(aside)
        self.assertEqual(len(copies), 1, copies)
        self.assertTrue(copies[0].startswith("m."), copies)
        self.assertTrue(os.path.exists(
            os.path.join(aside, copies[0], "manifest.json")))
        records = self.audit_of(source, "set_aside", module)
        self.assertEqual(len(records), 1)
        details = json.loads(records[0].details_json)
        self.assertEqual(details["owner"], target)
        self.assertEqual(records[0].outcome, "ok")
        # Once the owner deletes the module, no replica answers for it
        # (the old copy used to, with its old bytes).
        self.stub(target).DeleteModule(pb.DeleteModuleRequest(module=module),
                                       timeout=TIMEOUT)
        for replica in self.servers:
            with self.assertRaises(grpc.RpcError) as e:
                self.state(replica, module)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND,
                             replica)
        # Nor after a restart.
        self.servers[source].kill()
        self.servers[source].start()
        self.assertEqual(
            self.after_restart("the restarted replica to answer",
                               lambda: self.state(source, module)),
            grpc.StatusCode.NOT_FOUND)

    def test_9j_a_marked_copy_of_a_module_deleted_meanwhile_is_set_aside(self):
        # The old owner crashes after the takeover, before deleting its
        # copy, and the new owner deletes the module while it is down: at
        # its restart nothing in etcd names the module, and only the move
        # mark it wrote before sending tells its copy from a module it
        # hosts (which it would claim, serving the deleted module again).
        module = "gone/m"
        source, target, source_dir, kept = self.move_keeping_a_copy(
            module, seed=12)
        self.servers[source].kill()
        # What the crash leaves: the files as they were, and the mark the
        # sender writes before any of them leaves.
        shutil.rmtree(source_dir, ignore_errors=True)
        shutil.copytree(kept, source_dir)
        with open(os.path.join(source_dir, "moving.json"), "w") as f:
            json.dump({"move": "out", "peer": target}, f)
        self.stub(target).DeleteModule(pb.DeleteModuleRequest(module=module),
                                       timeout=TIMEOUT)
        self.assertNotIn(module, self.owners())
        self.servers[source].start()
        answers = {r: self.after_restart(
            "replica %s to answer" % r, lambda r=r: self.state(r, module))
            for r in self.servers}
        self.assertEqual(answers, {r: grpc.StatusCode.NOT_FOUND
                                   for r in self.servers})
        self.assertNotIn(module, self.owners())
        names = [m.module for m in self.stub(source).ListModules(
            pb.ListModulesRequest(namespace="gone"), timeout=TIMEOUT).modules]
        self.assertEqual(names, [])
        aside = os.path.join(self.servers[source].dir, "data", "set-aside",
                             "gone")
        copies = os.listdir(aside)
        self.assertEqual(len(copies), 1, copies)
        self.assertTrue(os.path.exists(
            os.path.join(aside, copies[0], "manifest.json")))
        records = self.after_restart(
            "the restarted replica to answer",
            lambda: self.audit_of(source, "set_aside", module))
        self.assertEqual(len(records), 1)
        self.assertEqual(json.loads(records[0].details_json)["owner"], "")
        # A build of the name is a new module, placed as any other.
        self.build("r0", module, seed=13)
        self.assertIn(module, self.owners())

    def test_9k_a_running_replicas_unsettled_copy_is_not_served(self):
        # A move whose answer was lost while etcd could not be asked keeps
        # the old owner's copy, marked, on a running replica; then the new
        # owner deletes the module. No replica owns it: the copy is not the
        # module, and neither a read nor a build may bring it back there.
        module = "left/m"
        self.build("r0", module, seed=14)
        source = self.owners()[module]
        source_dir = os.path.join(self.servers[source].dir, "data",
                                  "modules", "left", "m")
        with open(os.path.join(source_dir, "moving.json"), "w") as f:
            json.dump({"move": "out", "peer": "elsewhere"}, f)
        self.etcdctl("del", "/modelstate/owners/" + module)
        with self.assertRaises(grpc.RpcError) as e:
            self.state(source, module)
        self.assertEqual(e.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("left by a cluster move", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.build(source, module, seed=15)
        self.assertEqual(e.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertNotIn(module, self.owners())
        # Its next start sets it aside; the name is free again.
        self.servers[source].kill()
        self.servers[source].start()
        records = self.after_restart(
            "the restarted replica to answer",
            lambda: self.audit_of(source, "set_aside", module))
        self.assertEqual(len(records), 1)
        self.assertEqual(json.loads(records[0].details_json)["owner"], "")
        self.assertFalse(os.path.exists(source_dir))
        self.build(source, module, seed=15)
        self.assertIn(module, self.owners())


    def owner_revision(self, module):
        out = self.etcdctl("get", "/modelstate/owners/" + module, "-w", "json")
        return int(json.loads(out)["kvs"][0]["mod_revision"])

    def test_9l_a_move_whose_call_timed_out_is_called_off(self):
        # The sender's call ends at its deadline while the receiver (stopped
        # here) may still take the module over later: the sender calls the
        # move off in etcd, so it knows the module stays, keeps serving it
        # and drops its mark at once instead of at its next start.
        module = "calloff/m"
        source, target, source_dir = self.placed(module, seed=16)
        cluster = self.cluster_stub(source)
        stopped = self.servers[target].process
        stopped.send_signal(signal.SIGSTOP)
        try:
            with self.assertRaises(grpc.RpcError) as e:
                cluster.MoveModuleToReplica(
                    cluster_pb2.MoveModuleToReplicaRequest(
                        module=module, replica=target), timeout=1)
        finally:
            stopped.send_signal(signal.SIGCONT)
        self.assertEqual(e.exception.code(),
                         grpc.StatusCode.DEADLINE_EXCEEDED)
        self.wait_until("the sender to call the move off", lambda: not
                        os.path.exists(os.path.join(source_dir,
                                                    "moving.json")),
                        timeout=10)
        self.assertEqual(self.owners()[module], source)
        for replica in self.servers:
            self.state(replica, module)
        self.assertFalse(os.path.exists(os.path.join(
            self.servers[target].dir, "data", "modules", "calloff", "m",
            "manifest.json")))

    def test_9m_a_takeover_after_the_sender_called_the_move_off_fails(self):
        # The receiving half of the same race: the files of a move arrive
        # complete, but the sender has written its ownership again since the
        # move began (the call-off above). The takeover must fail: the
        # sender keeps serving the module, and a second owner's copy would
        # be taken by the next build.
        module = "calledoff/m"
        source, target, source_dir = self.placed(module, seed=17)
        began = self.owner_revision(module)
        self.etcdctl("put", "/modelstate/owners/" + module, source)
        self.assertGreater(self.owner_revision(module), began)
        names = sorted(n for n in os.listdir(source_dir)
                       if n.endswith(".safetensors")) + ["manifest.json"]
        header = cluster_pb2.ImportModuleRequest()
        header.header.module = module
        header.header.from_replica = source
        header.header.owner_revision = began
        messages = [header]
        for name in names:
            with open(os.path.join(source_dir, name), "rb") as f:
                data = f.read()
            header.header.files.add(name=name, bytes=len(data))
            messages.append(cluster_pb2.ImportModuleRequest(data=data))
        with open(self.secret) as f:
            secret = f.read().strip()
        cluster = self.cluster_stub(target)
        with self.assertRaises(grpc.RpcError) as e:
            cluster.ImportModule(iter(messages), timeout=TIMEOUT, metadata=[
                ("x-modelstate-replica-secret", secret),
                ("x-modelstate-forwarded-peer", "ipv4:127.0.0.1:1"),
                ("x-modelstate-forwarded-by", source)])
        self.assertEqual(e.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("replica %s called the move of '%s' off" %
                      (source, module), e.exception.details())
        self.assertEqual(self.owners()[module], source)
        self.assertFalse(os.path.exists(os.path.join(
            self.servers[target].dir, "data", "modules", "calledoff", "m")))
        for replica in self.servers:
            self.state(replica, module)
        # A sender that crashed mid-move calls it off at its restart, before
        # it hosts the module again: a takeover begun before then fails.
        with open(os.path.join(source_dir, "moving.json"), "w") as f:
            json.dump({"move": "out", "peer": target}, f)
        before = self.owner_revision(module)
        self.servers[source].kill()
        self.servers[source].start()
        self.after_restart("the restarted sender to answer",
                           lambda: self.state(source, module))
        self.assertGreater(self.owner_revision(module), before)
        self.assertEqual(self.owners()[module], source)
        self.assertFalse(os.path.exists(os.path.join(source_dir,
                                                     "moving.json")))


def write_certificate_extensions(d):
    """openssl's extension files for a replica's certificate (server and
    client of the other replicas, on 127.0.0.1) and a client's."""
    with open(os.path.join(d, "replica.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")


def make_certificates(d, cas, certificates):
    """Runs openssl in `d`: each of `cas` (file stem, CN) a self-signed CA
    (stem.key, stem.pem), then each of `certificates` (file stem, CA stem,
    CN, extension file) a key and a certificate that CA signed."""
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    script = ["set -e", "cd " + d]
    for stem, cn in cas:
        script.append("openssl req -x509 %s -keyout %s.key -out %s.pem "
                      "-days 2 -subj /CN=%s" % (ec, stem, stem, cn))
    for stem, ca, cn, ext in certificates:
        script += [
            "openssl req %s -keyout %s.key -out %s.csr -subj /CN=%s"
            % (ec, stem, stem, cn),
            "openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key "
            "-CAcreateserial -out %s.pem -days 2 -extfile %s"
            % (stem, ca, ca, stem, ext)]
    subprocess.run("; ".join(script), shell=True, check=True,
                   capture_output=True)


def write_tokens_and_secret(d, secret):
    """tokens.json, where carol-cert (the client certificate's name) is
    admin everywhere, and the cluster secret file; both private (0600)."""
    with open(os.open(os.path.join(d, "tokens.json"),
                      os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        json.dump({"principals": [
            {"identity": "carol-cert", "roles": {"admin": ["*"]}}]}, f)
    with open(os.open(os.path.join(d, "secret"),
                      os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secret + "\n")


class TlsClusterTest(unittest.TestCase):
    """Two TLS replicas with mutual TLS: replica-to-replica calls use TLS."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="modelstate-tls-")
        d = cls.dir
        write_certificate_extensions(d)
        make_certificates(
            d, [("ca", "cluster-ca")],
            [("replica", "ca", "replica", "replica.ext"),
             ("client", "ca", "carol-cert", "client.ext")])
        write_tokens_and_secret(d, "a-cluster-secret-for-tls-replicas")
        files = {name: os.path.join(d, name) for name in
                 ("ca.pem", "replica.pem", "replica.key", "tokens.json",
                  "secret")}
        # etcd over mutual TLS too, with the same CA: each replica presents
        # its certificate to etcd as to the other replicas.
        cls.etcd = Etcd(tls={"cert": files["replica.pem"],
                             "key": files["replica.key"],
                             "ca": files["ca.pem"]})
        cls.etcd_tls = ["--etcd_ca_file=" + files["ca.pem"],
                        "--etcd_cert_file=" + files["replica.pem"],
                        "--etcd_key_file=" + files["replica.key"]]
        cls.servers = {}
        for replica in ("t0", "t1"):
            cls.servers[replica] = server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + cls.etcd.endpoint,
                "--replica_id=" + replica, "--cluster_key_prefix=/tls/",
                "--cluster_secret_file=" + files["secret"],
                "--tls_cert_file=" + files["replica.pem"],
                "--tls_key_file=" + files["replica.key"],
                "--tls_client_ca_file=" + files["ca.pem"],
                "--cluster_ca_file=" + files["ca.pem"],
                "--token_file=" + files["tokens.json"], *cls.etcd_tls)

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers.values():
            server.stop()
        cls.etcd.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def channel(self, replica):
        def read(name):
            with open(os.path.join(self.dir, name), "rb") as f:
                return f.read()
        credentials = grpc.ssl_channel_credentials(
            read("ca.pem"), read("client.key"), read("client.pem"))
        channel = grpc.secure_channel(self.servers[replica].address,
                                      credentials)
        self.addCleanup(channel.close)
        return channel

    def stub(self, replica):
        return pb_grpc.ModelStateServiceStub(self.channel(replica))

    def test_replicas_call_each_other_over_tls(self):
        def no_biases(event):
            if event.name == "bias":
                return pb.HookAnswer(verdict=pb.HookAnswer.REJECT,
                                     reason="no biases over TLS")
            return pb.HookAnswer(verdict=pb.HookAnswer.APPROVE)
        # The subscriber's stream, over mutual TLS to t0.
        subscriber = Subscriber(self.channel("t0"), pb.Subscription(
            name="tls-policy", namespaces=["tls"]), no_biases)
        self.addCleanup(subscriber.close)
        self.assertTrue(subscriber.acked.wait(TIMEOUT))
        self.assertIsNone(subscriber.error)
        # Two builds through t0: one lands on each replica (least loaded).
        for i in range(2):
            module = "tls/m%d" % i
            request = pb.BuildModuleRequest(module=module, seed=i)
            request.spec.type = "Linear"
            request.spec.args.add().number_value = 4
            request.spec.args.add().number_value = 3
            response = self.stub("t0").BuildModule(request, timeout=TIMEOUT)
            outcome = {r.name: r for r in response.registrations}
            self.assertEqual(outcome["bias"].outcome,
                             module_pb2.OUTCOME_BLOCK)
            self.assertIn("no biases over TLS", outcome["bias"].reason)
        status = cluster_pb2_grpc.ClusterServiceStub(
            self.channel("t0")).GetClusterStatus(
                cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)
        owners = {p.module: p.owner for p in status.placements}
        self.assertEqual(sorted(owners.values()), ["t0", "t1"])
        self.assertEqual({e.replica for e in subscriber.events},
                         {"t0", "t1"})
        for module, owner in owners.items():
            other = "t1" if owner == "t0" else "t0"
            direct = list(self.stub(owner).GetStateDict(
                pb.GetStateDictRequest(module=module), timeout=TIMEOUT))
            forwarded = list(self.stub(other).GetStateDict(
                pb.GetStateDictRequest(module=module), timeout=TIMEOUT))
            self.assertEqual(b"".join(c.data for c in direct),
                             b"".join(c.data for c in forwarded))
            # The owner audited the build under the client certificate's
            # name, not the forwarding replica's.
            ns, name = module.split("/")
            records = self.stub(owner).QueryAudit(pb.QueryAuditRequest(
                filter=pb.AuditFilter(namespace=ns, module=name,
                                      type="build")),
                timeout=TIMEOUT).records
            self.assertEqual([r.identity for r in records], ["carol-cert"])


    def test_etcd_credentials_others_may_write_are_refused(self):
        # Whoever may write the key chooses the identity a replica shows
        # etcd; whoever may write the CA chooses the etcd it believes.
        d = tempfile.mkdtemp(dir=self.dir)
        secret = os.path.join(self.dir, "secret")

        def start(*flags):
            return subprocess.run(
                [SERVER_BINARY, "--listen=127.0.0.1:0",
                 "--data_dir=" + os.path.join(d, "data"),
                 "--etcd_endpoints=" + self.etcd.endpoint,
                 "--replica_id=t9", "--cluster_key_prefix=/tls/",
                 "--cluster_secret_file=" + secret] + list(flags),
                capture_output=True, text=True, timeout=30)
        for flag, name in (("etcd_key_file", "replica.key"),
                           ("etcd_ca_file", "ca.pem")):
            loose = os.path.join(d, name)
            shutil.copy(os.path.join(self.dir, name), loose)
            os.chmod(loose, 0o666)
            kept = [a for a in self.etcd_tls
                    if not a.startswith("--%s=" % flag)]
            run = start(*kept, "--%s=%s" % (flag, loose))
            self.assertEqual(run.returncode, 2, run.stderr)
            self.assertIn("--%s: %s is writable by its group and others "
                          "(mode 0666)" % (flag, loose), run.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "data")))
        # A client certificate needs its key, and TLS to etcd.
        run = start(self.etcd_tls[0], self.etcd_tls[1])
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("give both or neither", run.stderr)
        run = start(self.etcd_tls[1], self.etcd_tls[2])
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("needs --etcd_ca_file", run.stderr)

class TlsRotationTest(unittest.TestCase):
    """Certificates rotated to a new CA on running TLS replicas, as
    cert-manager does: the calls between replicas follow the reload (they
    used to keep the certificate and --cluster_ca_file read at start)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="modelstate-tls-roll-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        d = self.dir
        write_certificate_extensions(d)
        make_certificates(
            d, [(ca + "-ca", ca + "-cluster-ca") for ca in ("old", "new")],
            [("%s-%s" % (ca, who), ca + "-ca", cn, who + ".ext")
             for ca in ("old", "new")
             for who, cn in (("replica", "replica"),
                             ("client", "carol-cert"))])
        self.install(ca=["old"], replica="old")
        write_tokens_and_secret(d, "a-cluster-secret-for-a-tls-roll")
        self.etcd = Etcd()
        self.addCleanup(self.etcd.stop)
        self.servers = {}
        for replica in ("r0", "r1"):
            # As in the Kubernetes overlay: ca.pem is both the client CA
            # and the cluster CA; the reloads come from SIGHUP here.
            self.servers[replica] = server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + self.etcd.endpoint,
                "--replica_id=" + replica, "--reload_seconds=0",
                "--cluster_secret_file=" + os.path.join(d, "secret"),
                "--tls_cert_file=" + os.path.join(d, "tls.crt"),
                "--tls_key_file=" + os.path.join(d, "tls.key"),
                "--tls_client_ca_file=" + os.path.join(d, "ca.pem"),
                "--cluster_ca_file=" + os.path.join(d, "ca.pem"),
                "--token_file=" + os.path.join(d, "tokens.json"))
            self.addCleanup(self.servers[replica].stop)

    def read(self, name):
        with open(os.path.join(self.dir, name), "rb") as f:
            return f.read()

    def install(self, ca, replica):
        """Swaps the files in place as the kubelet does (each renamed over
        the old one): ca.pem holds the CAs `ca`, tls.crt / tls.key are the
        replica certificate signed by CA `replica` (or the key of another
        when `replica` is a pair (cert, key))."""
        cert, key = replica if isinstance(replica, tuple) else (replica,) * 2
        files = {"ca.pem": b"".join(self.read(c + "-ca.pem") for c in ca),
                 "tls.crt": self.read(cert + "-replica.pem"),
                 "tls.key": self.read(key + "-replica.key")}
        for name, data in files.items():
            path = os.path.join(self.dir, name)
            with open(os.open(path + ".new", os.O_WRONLY | os.O_CREAT |
                              os.O_TRUNC, 0o600), "wb") as f:
                f.write(data)
            os.replace(path + ".new", path)

    def reload(self, expected):
        """SIGHUP to every replica; returns once each has logged
        `expected` one time more than before."""
        def count(server):
            with open(os.path.join(server.dir, "server.log")) as f:
                return f.read().count(expected)
        before = {r: count(s) for r, s in self.servers.items()}
        for server in self.servers.values():
            server.process.send_signal(signal.SIGHUP)
        deadline = time.time() + TIMEOUT
        for replica, server in self.servers.items():
            while count(server) <= before[replica]:
                self.assertLess(time.time(), deadline,
                                "%s did not log %r" % (replica, expected))
                time.sleep(0.05)

    def stub(self, replica, client):
        """As carol-cert, with the client certificate signed by CA
        `client`; both CAs are trusted for the server's certificate."""
        channel = grpc.secure_channel(
            self.servers[replica].address, grpc.ssl_channel_credentials(
                self.read("old-ca.pem") + self.read("new-ca.pem"),
                self.read(client + "-client.key"),
                self.read(client + "-client.pem")))
        self.addCleanup(channel.close)
        return pb_grpc.ModelStateServiceStub(channel)

    def check_forwarding(self, owners, client, pairs):
        """Each module of `owners` read through the other replica, for the
        (reader, owner) `pairs`, matches its owner's bytes."""
        for module, owner in owners.items():
            other = "r1" if owner == "r0" else "r0"
            if (other, owner) not in pairs:
                continue
            request = pb.GetStateDictRequest(module=module)
            direct = list(self.stub(owner, client).GetStateDict(
                request, timeout=TIMEOUT))
            try:
                forwarded = list(self.stub(other, client).GetStateDict(
                    request, timeout=TIMEOUT))
            except grpc.RpcError as e:
                self.fail("%s through %s: %s %s" % (
                    module, other, e.code(), e.details()))
            self.assertEqual(b"".join(c.data for c in direct),
                             b"".join(c.data for c in forwarded))

    def test_a_certificate_rotated_to_a_new_ca_reaches_replica_calls(self):
        # Two builds through r0: one lands on each replica, so r0 has
        # called r1 (a channel made with the old certificate) and r1 has
        # not called r0 yet.
        for i in range(2):
            request = pb.BuildModuleRequest(module="roll/m%d" % i, seed=i)
            request.spec.type = "Linear"
            request.spec.args.add().number_value = 4
            request.spec.args.add().number_value = 3
            self.stub("r0", "old").BuildModule(request, timeout=TIMEOUT)
        channel = grpc.secure_channel(
            self.servers["r0"].address, grpc.ssl_channel_credentials(
                self.read("old-ca.pem"), self.read("old-client.key"),
                self.read("old-client.pem")))
        self.addCleanup(channel.close)
        status = cluster_pb2_grpc.ClusterServiceStub(channel).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)
        owners = {p.module: p.owner for p in status.placements}
        self.assertEqual(sorted(owners.values()), ["r0", "r1"])
        # The roll: both CAs trusted, the certificate signed by the new one.
        self.install(ca=["old", "new"], replica="new")
        self.reload("new TLS connections get the certificate")
        # r1 calls r0 for the first time: it must trust r0's new
        # certificate, which the new CA alone signed.
        self.check_forwarding(owners, "new", {("r1", "r0")})
        # A bad set (the old key with the new certificate) is kept out of
        # the calls between replicas too, and said so once.
        self.install(ca=["old", "new"], replica=("new", "old"))
        self.reload("calls to other replicas keep the certificate and "
                    "--cluster_ca_file in force")
        self.check_forwarding(owners, "new", {("r1", "r0"), ("r0", "r1")})
        self.install(ca=["old", "new"], replica="new")
        self.reload("calls to other replicas: the TLS files read well "
                    "again")
        # The old CA dropped: a replica that still presented the
        # certificate it started with would be refused by the other.
        self.install(ca=["new"], replica="new")
        self.reload("client certificates are checked against the new "
                    "--tls_client_ca_file")
        self.check_forwarding(owners, "new", {("r1", "r0"), ("r0", "r1")})
        for server in self.servers.values():
            with open(os.path.join(server.dir, "server.log")) as f:
                log = f.read()
            self.assertIn("SIGHUP: new connections to other replicas present "
                          "the certificate subject /CN=replica", log)
            self.assertIn("their certificates are checked against the new "
                          "--cluster_ca_file", log)


class EtcdTlsRotationTest(unittest.TestCase):
    """etcd's client certificate and CA rolled to a new CA on running
    replicas, as cert-manager renews a Secret: after SIGHUP the replicas
    reach etcd with the new files (they used to keep the ones read at start,
    and lost their lease once etcd stopped trusting the old CA)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="modelstate-etcd-roll-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        d = self.dir
        write_certificate_extensions(d)
        # One certificate per CA, for 127.0.0.1, serves as etcd's own and
        # as the replicas' client certificate.
        make_certificates(
            d, [(ca + "-ca", ca + "-etcd-ca") for ca in ("old", "new")],
            [(ca, ca + "-ca", ca + "-member", "replica.ext")
             for ca in ("old", "new")])
        self.install(ca=["old"], cert="old")
        self.write("both-ca.pem", self.read("old-ca.pem") +
                   self.read("new-ca.pem"))
        self.write("secret", b"a-cluster-secret-for-an-etcd-roll\n")
        # A quota file: each SIGHUP logs a line for it, after the etcd one.
        self.write("quotas.json", b'{"default": {"max_modules": 1000}}')
        self.etcd = Etcd(tls=self.etcd_tls("old", ["old"]))
        self.addCleanup(self.etcd.stop)
        self.servers = {}
        for replica in ("r0", "r1"):
            self.servers[replica] = server_process.Server(
                SERVER_BINARY, "--etcd_endpoints=" + self.etcd.endpoint,
                "--replica_id=" + replica, "--reload_seconds=0",
                "--cluster_lease_seconds=%d" % LEASE_SECONDS,
                "--cluster_secret_file=" + os.path.join(d, "secret"),
                "--quota_file=" + os.path.join(d, "quotas.json"),
                "--etcd_ca_file=" + os.path.join(d, "etcd-ca.pem"),
                "--etcd_cert_file=" + os.path.join(d, "etcd.crt"),
                "--etcd_key_file=" + os.path.join(d, "etcd.key"))
            self.addCleanup(self.servers[replica].stop)

    def read(self, name):
        with open(os.path.join(self.dir, name), "rb") as f:
            return f.read()

    def write(self, name, data):
        """Renamed over the old file, as the kubelet swaps a Secret's."""
        path = os.path.join(self.dir, name)
        with open(os.open(path + ".new", os.O_WRONLY | os.O_CREAT |
                          os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)

    def install(self, ca, cert, key=None):
        """The replicas' etcd files: etcd-ca.pem holds the CAs `ca`,
        etcd.crt / etcd.key the certificate signed by CA `cert` (and the
        key of CA `key`'s, when given)."""
        self.write("etcd-ca.pem", b"".join(self.read(c + "-ca.pem")
                                           for c in ca))
        self.write("etcd.crt", self.read(cert + ".pem"))
        self.write("etcd.key", self.read((key or cert) + ".key"))

    def etcd_tls(self, cert, trusted):
        self.write("etcd-trusted.pem", b"".join(self.read(c + "-ca.pem")
                                                for c in trusted))
        return {"cert": os.path.join(self.dir, cert + ".pem"),
                "key": os.path.join(self.dir, cert + ".key"),
                "ca": os.path.join(self.dir, "etcd-trusted.pem")}

    def restart_etcd(self, cert, trusted):
        """etcd restarted on its data with certificate `cert`, trusting
        client certificates of the CAs `trusted` only."""
        self.etcd.process.kill()
        self.etcd.process.wait()
        self.etcd.tls = self.etcd_tls(cert, trusted)
        self.etcd.start()

    def log(self, replica):
        with open(os.path.join(self.servers[replica].dir, "server.log")) as f:
            return f.read()

    def reload(self):
        """SIGHUP to every replica; returns once each has logged the quota
        line that comes after the etcd files' (a binary that does not
        re-read them logs it too)."""
        quotas = "SIGHUP: quotas from"
        before = {r: self.log(r).count(quotas) for r in self.servers}
        for server in self.servers.values():
            server.process.send_signal(signal.SIGHUP)
        deadline = time.time() + TIMEOUT
        for replica in self.servers:
            while self.log(replica).count(quotas) <= before[replica]:
                self.assertLess(time.time(), deadline,
                                "%s did not reload" % replica)
                time.sleep(0.05)

    def stub(self, replica):
        channel = grpc.insecure_channel(self.servers[replica].address)
        self.addCleanup(channel.close)
        return pb_grpc.ModelStateServiceStub(channel)

    def build(self, module, seed):
        request = pb.BuildModuleRequest(module=module, seed=seed)
        request.spec.type = "Linear"
        request.spec.args.add().number_value = 4
        request.spec.args.add().number_value = 3
        self.stub("r0").BuildModule(request, timeout=TIMEOUT)

    def owners(self, via):
        channel = grpc.insecure_channel(self.servers[via].address)
        self.addCleanup(channel.close)
        status = cluster_pb2_grpc.ClusterServiceStub(channel).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)
        self.assertEqual(sorted(m.replica for m in status.members),
                         ["r0", "r1"], via)
        return {p.module: p.owner for p in status.placements}

    def check_cluster(self, modules):
        """Both replicas are members, each module is read through the
        replica that does not own it as its owner has it, and a new module
        is built (a write: the owner holds a live lease)."""
        for via in self.servers:
            owners = self.owners(via)
            for module in modules:
                owner = owners[module]
                other = "r1" if owner == "r0" else "r0"
                request = pb.GetStateDictRequest(module=module)
                direct = list(self.stub(owner).GetStateDict(
                    request, timeout=TIMEOUT))
                forwarded = list(self.stub(other).GetStateDict(
                    request, timeout=TIMEOUT))
                self.assertEqual(b"".join(c.data for c in direct),
                                 b"".join(c.data for c in forwarded))
        self.built = getattr(self, "built", 0) + 1
        self.build("roll/later%d" % self.built, seed=self.built)

    def settled(self, modules, what):
        """check_cluster once etcd, just restarted, answers again."""
        deadline = time.time() + TIMEOUT
        while True:
            try:
                return self.check_cluster(modules)
            except grpc.RpcError as e:
                if time.time() > deadline:
                    self.fail("%s: %s %s" % (what, e.code(), e.details()))
                time.sleep(0.2)

    def test_etcd_certificate_rolled_to_a_new_ca(self):
        for i in range(2):
            self.build("roll/m%d" % i, seed=i)
        modules = sorted(self.owners("r0"))
        self.assertEqual(sorted(self.owners("r0").values()), ["r0", "r1"])
        # The roll: etcd trusts both CAs; the replicas get the certificate
        # the new CA signed; etcd drops the old CA (and presents a
        # certificate the new CA signed).
        self.restart_etcd("old", ["old", "new"])
        self.settled(modules, "etcd trusting both CAs")
        self.install(ca=["old", "new"], cert="new")
        self.reload()
        self.check_cluster(modules)
        self.restart_etcd("new", ["new"])
        # Past a lease: a replica that still presented the old certificate
        # (or trusted only the old CA) would have lost it by now.
        time.sleep(LEASE_SECONDS + 1)
        self.settled(modules, "etcd trusting the new CA alone")
        for replica in self.servers:
            log = self.log(replica)
            self.assertIn("SIGHUP: new connections to etcd present the "
                          "certificate subject /CN=new-member", log)
            self.assertIn("check etcd's certificate against the new "
                          "--etcd_ca_file", log)
            # The lease survived the switch (and etcd's restarts): no
            # replica had to register again.
            self.assertNotIn("registering again", log)
        # A bad set (the old key with the new certificate) is kept out,
        # and said once: etcd still takes the set in force.
        self.install(ca=["new"], cert="new", key="old")
        self.reload()
        self.reload()
        for replica in self.servers:
            log = self.log(replica)
            self.assertIn("SIGHUP: calls to etcd keep the credentials in "
                          "force (subject /CN=new-member", log)
            self.assertEqual(log.count(
                "is not the key of the first certificate in"), 1, replica)
        self.check_cluster(modules)


# An etcd member that answers every login with etcd's "too many requests"
# (RESOURCE_EXHAUSTED): prints its port, serves until its stdin closes, then
# prints how many logins it refused.
BUSY_ETCD = """
import sys
from concurrent import futures
import grpc
calls = []
def busy(request, context):
    calls.append(1)
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                  "etcdserver: too many requests")
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
    "etcdserverpb.Auth",
    {"Authenticate": grpc.unary_unary_rpc_method_handler(busy)})])
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
sys.stdin.read()
server.stop(0)
print(len(calls), flush=True)
"""


class EtcdAuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd = Etcd()
        cls.dir = tempfile.mkdtemp(prefix="modelstate-etcd-auth-")
        etcdctl = ["etcdctl", "--endpoints=" + cls.etcd.endpoint]
        env = dict(os.environ, ETCDCTL_API="3")
        for args in (["user", "add", "root:root-password"],
                     ["user", "add", "modelstate:member-password"],
                     ["role", "add", "member"],
                     ["role", "grant-permission", "member", "--prefix=true",
                      "readwrite", "/modelstate/"],
                     ["user", "grant-role", "modelstate", "member"],
                     ["auth", "enable"]):
            subprocess.run(etcdctl + args, check=True, env=env,
                           capture_output=True)
        cls.secret = os.path.join(cls.dir, "secret")
        with open(cls.secret, "w") as f:
            f.write("a-cluster-secret-of-some-length\n")

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def password_file(self, password):
        path = os.path.join(self.dir, password)
        # 0600 whatever the umask: the server refuses a password file
        # others may write.
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(password + "\n")
        return path

    def test_a_member_authenticates_to_etcd(self):
        dead = "127.0.0.1:1"
        server = server_process.Server(
            SERVER_BINARY,
            "--etcd_endpoints=%s,%s" % (dead, self.etcd.endpoint),
            "--etcd_user=modelstate",
            "--etcd_password_file=" + self.password_file("member-password"),
            "--replica_id=a0", "--cluster_secret_file=" + self.secret)
        self.addCleanup(server.stop)
        channel = grpc.insecure_channel(server.address)
        self.addCleanup(channel.close)
        stub = pb_grpc.ModelStateServiceStub(channel)
        request = pb.BuildModuleRequest(module="auth/m")
        request.spec.type = "Linear"
        request.spec.args.add().number_value = 2
        request.spec.args.add().number_value = 2
        stub.BuildModule(request, timeout=TIMEOUT)
        status = cluster_pb2_grpc.ClusterServiceStub(channel).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)
        self.assertEqual([m.replica for m in status.members], ["a0"])
        self.assertEqual([(p.module, p.owner) for p in status.placements],
                         [("auth/m", "a0")])

    def test_a_wrong_password_keeps_the_server_from_starting(self):
        # The refusal is what the log says, even with an unreachable
        # endpoint after the one that refused (every member keeps the same
        # users: it is not tried, and its "unreachable" hid the refusal).
        root = tempfile.mkdtemp(dir=self.dir)
        with self.assertRaises(RuntimeError):
            server_process.Server(
                SERVER_BINARY,
                "--etcd_endpoints=%s,127.0.0.1:1" % self.etcd.endpoint,
                "--etcd_user=modelstate",
                "--etcd_password_file=" + self.password_file("wrong"),
                "--replica_id=a1", "--cluster_secret_file=" + self.secret,
                root=root)
        [log] = glob.glob(os.path.join(root, "*", "server.log"))
        with open(log) as f:
            self.assertIn("etcd refused the login of user 'modelstate'",
                          f.read())


    def test_b_a_new_password_is_taken_on_sighup(self):
        # The password changed in etcd (which drops the user's tokens) and
        # in the replica's Secret: after SIGHUP the replica logs in with
        # the new one. It used to keep the one read at start, fail to log
        # in again and lose its lease.
        path = self.password_file("rotated")
        self.write_password(path, "member-password")
        server = server_process.Server(
            SERVER_BINARY, "--etcd_endpoints=" + self.etcd.endpoint,
            "--etcd_user=modelstate", "--etcd_password_file=" + path,
            "--replica_id=a2", "--reload_seconds=0",
            "--cluster_lease_seconds=%d" % LEASE_SECONDS,
            "--cluster_secret_file=" + self.secret)
        self.addCleanup(server.stop)
        channel = grpc.insecure_channel(server.address)
        self.addCleanup(channel.close)
        stub = pb_grpc.ModelStateServiceStub(channel)
        cluster = cluster_pb2_grpc.ClusterServiceStub(channel)

        def build(module):
            request = pb.BuildModuleRequest(module=module)
            request.spec.type = "Linear"
            request.spec.args.add().number_value = 2
            request.spec.args.add().number_value = 2
            stub.BuildModule(request, timeout=TIMEOUT)
        build("auth/before")
        self.addCleanup(self.set_password, "member-password")
        self.set_password("member-password-2")
        self.write_password(path, "member-password-2")
        server.process.send_signal(signal.SIGHUP)
        # Past a lease: the replica renewed it with a new token.
        time.sleep(LEASE_SECONDS + 1)
        status = cluster.GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=TIMEOUT)
        self.assertIn("a2", [m.replica for m in status.members])
        build("auth/after")
        with open(os.path.join(server.dir, "server.log")) as f:
            log = f.read()
        self.assertIn("SIGHUP: new connections to etcd log in with the new "
                      "--etcd_password_file", log)
        # The lease it had (the switch is not a new membership).
        self.assertNotIn("registering again", log)

    def test_b_a_busy_member_is_passed_over(self):
        # A member that cannot log anyone in just now (etcd's "too many
        # requests") is not a refusal of the password: the next endpoint
        # is tried, and the replica starts. The busy member is a process of
        # its own: a gRPC server in this one would be forked with every
        # server this test starts.
        busy = subprocess.Popen(
            [sys.executable, "-c", BUSY_ETCD], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        self.addCleanup(busy.communicate)
        self.addCleanup(busy.kill)
        port = int(busy.stdout.readline())
        server = server_process.Server(
            SERVER_BINARY,
            "--etcd_endpoints=127.0.0.1:%d,%s" % (port, self.etcd.endpoint),
            "--etcd_user=modelstate",
            "--etcd_password_file=" + self.password_file("member-password"),
            "--replica_id=a4", "--cluster_key_prefix=/modelstate/busy/",
            "--cluster_secret_file=" + self.secret)
        self.addCleanup(server.stop)
        refused, _ = busy.communicate(timeout=30)
        self.assertGreaterEqual(int(refused), 1)

    def test_c_a_refused_login_is_unavailable_to_clients(self):
        # The password changed in etcd (which drops the user's tokens) but
        # not in the replica's file: a call that needs etcd is UNAVAILABLE,
        # naming the login, not etcd's INVALID_ARGUMENT, which a client
        # would take for a fault of its own request.
        server = server_process.Server(
            SERVER_BINARY, "--etcd_endpoints=" + self.etcd.endpoint,
            "--etcd_user=modelstate",
            "--etcd_password_file=" + self.password_file("member-password"),
            "--replica_id=a3", "--cluster_secret_file=" + self.secret)
        self.addCleanup(server.stop)
        channel = grpc.insecure_channel(server.address)
        self.addCleanup(channel.close)
        stub = pb_grpc.ModelStateServiceStub(channel)
        self.addCleanup(self.set_password, "member-password")
        self.set_password("member-password-3")
        request = pb.BuildModuleRequest(module="auth/refused")
        request.spec.type = "Linear"
        request.spec.args.add().number_value = 2
        request.spec.args.add().number_value = 2
        with self.assertRaises(grpc.RpcError) as refused:
            stub.BuildModule(request, timeout=TIMEOUT)
        self.assertEqual(refused.exception.code(),
                         grpc.StatusCode.UNAVAILABLE,
                         refused.exception.details())
        self.assertIn("etcd refused the login of user 'modelstate'",
                      refused.exception.details())

    def write_password(self, path, password):
        with open(os.open(path + ".new", os.O_WRONLY | os.O_CREAT |
                          os.O_TRUNC, 0o600), "w") as f:
            f.write(password + "\n")
        os.replace(path + ".new", path)

    def set_password(self, password):
        subprocess.run(
            ["etcdctl", "--endpoints=" + self.etcd.endpoint,
             "--user=root:root-password", "user", "passwd", "modelstate",
             "--interactive=false"], input=password + "\n", text=True,
            check=True, capture_output=True,
            env=dict(os.environ, ETCDCTL_API="3"))

if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if shutil.which("etcd") is None:
        print("etcd is not installed: skipped", file=sys.stderr)
        sys.exit(SKIP)
    SERVER_BINARY = sys.argv.pop(1)
    CLI_BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
