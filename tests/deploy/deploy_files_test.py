#!/usr/bin/env python3
"""Static checks of the container and Kubernetes deployment files.

No Docker engine or cluster is needed: the files are parsed and checked
against each other, against the deploy scripts that CI runs, and against the
real binaries:

- Dockerfile: every build-stage step that installs or builds goes through
  deploy/build.sh or deploy/common.sh (the code CI's deploy/test.sh uses);
  the runtime stage is non-root, has /data, 50051 and a health check, and
  installs no -dev package but every library the binaries load.
- deploy/compose.yaml: the services; the policy file they mount exists; the
  modelstatectl commands and options they run exist; the token files that
  the tokens service makes match, and the real server accepts them.
- deploy/k8s/*.yaml: the expected kinds, a hardened StatefulSet with gRPC
  probes, and flags in the ConfigMap that modelstate-server really has.
- deploy/k8s-cluster: the overlay as kustomize renders it (its resources,
  the base, the strategic merge patch): three replicas whose flags are
  real, --etcd_endpoints and etcd's --initial-cluster naming exactly the
  etcd StatefulSet's pods, the advertised address, the cluster secret and
  CA mounts, and NetworkPolicies that let the servers (only) reach etcd's
  client port and each other.
- deploy/compose-cluster.yaml: three servers and etcd; real flags, the
  advertised addresses and etcd endpoint matching the service names,
  distinct replica ids and ports, and the secrets service's files.

The binaries come from the environment (ctest sets both):
  MODELSTATE_SERVER_BINARY  modelstate-server, for --helpfull and ldd
  MODELSTATE_CLI_BINARY     modelstatectl, for its commands' --help
Checks that need one are skipped when it is not set.

Usage: /usr/bin/python3 tests/deploy/deploy_files_test.py [-v]
"""

import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import unittest

import yaml  # Debian: python3-yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
K8S_CLUSTER = os.path.join(DEPLOY, "k8s-cluster")
SERVER_BINARY = os.environ.get("MODELSTATE_SERVER_BINARY", "")
CLI_BINARY = os.environ.get("MODELSTATE_CLI_BINARY", "")

# Steps with these words install packages or compile.
INSTALL_OR_BUILD = re.compile(
    r"(^|[\s;&|(])(apt-get|apt|dpkg|cmake|make|ninja|gcc|g\+\+|c\+\+|clang\+\+"
    r"|pip3?)(?=[\s;&|)]|$)")
# ...and must reach them through these scripts.
DEPLOY_SCRIPT = re.compile(
    r"(^|[\s;&|(])(\./)?deploy/build\.sh(\s|$)"
    r"|(source|\.)\s+(\./)?deploy/common\.sh")
SOURCES_COMMON = re.compile(r"^\s*(source|\.)\s+.*\bcommon\.sh\b", re.M)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def yaml_docs(path):
    return [d for d in yaml.safe_load_all(read(path)) if d is not None]


# ------------------------------------------------------------- Dockerfile --
def parse_dockerfile(text):
    """Returns the stages: [{"from", "name", "steps": [(INSTR, args)]}].

    Joins continued lines and drops comment lines, as Docker does (also
    inside a continued instruction).
    """
    stages, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        instr, _, args = (pending + stripped).partition(" ")
        pending = ""
        instr, args = instr.upper(), args.strip()
        if instr == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append({"from": words[0], "name": name, "steps": []})
        else:
            stages[-1]["steps"].append((instr, args))
    return stages


def exec_form(args):
    """CMD/ENTRYPOINT/VOLUME arguments as a list (JSON or shell words)."""
    if args.startswith("["):
        return json.loads(args)
    return shlex.split(args)


def steps(stage, instr):
    return [args for i, args in stage["steps"] if i == instr]


def apt_installed(run):
    """Package names that one RUN's `apt-get install` commands name."""
    pkgs = []
    for command in re.split(r"&&|;|\|\|", run):
        words = shlex.split(command)
        if words[:1] in (["apt-get"], ["apt"]) and "install" in words:
            rest = words[words.index("install") + 1:]
            pkgs += [w for w in rest if not w.startswith("-")]
    return pkgs


def bash_array(text, name):
    """The literal words of NAME=( ... ) in a shell script."""
    m = re.search(r"^%s=\((.*?)\)" % re.escape(name), text, re.M | re.S)
    if not m:
        return None
    body = "\n".join(l.split("#")[0] for l in m.group(1).splitlines())
    return shlex.split(body)


# --------------------------------------------------------------- binaries --
_help_cache = {}


def run_help(*argv):
    if argv not in _help_cache:
        p = subprocess.run(list(argv), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        _help_cache[argv] = p.stdout
    return _help_cache[argv]


def server_flags():
    """Every flag name modelstate-server --helpfull lists."""
    text = run_help(SERVER_BINARY, "--helpfull")
    return set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.M))


def assert_server_flags(test, flag_lines, args):
    """Every line of a flagfile and every container argument is a flag
    modelstate-server has."""
    known = server_flags()
    test.assertIn("data_dir", known)  # the --helpfull parsing works
    for line in flag_lines:
        test.assertTrue(line.startswith("--"), line)
    missing = [l for l in flag_lines if flag_name(l) not in known]
    test.assertEqual(missing, [], "flags modelstate-server does not have")
    for arg in args:
        test.assertIn(flag_name(arg), known | {"flagfile"})


def flag_name(arg):
    return arg[2:].split("=", 1)[0]


def flag_value(args, name):
    """The value of the last --name=value in args (later flags win), or None."""
    value = None
    for a in args:
        if a.startswith("--%s=" % name):
            value = a.split("=", 1)[1]
    return value


def port_of(address):
    return int(address.rsplit(":", 1)[1])


class CliCheck:
    """Checks modelstatectl invocations against the CLI's own --help."""

    def __init__(self, test):
        self.test = test

    def commands(self):
        text = run_help(CLI_BINARY, "--help")
        section = text.split("Commands:", 1)[1].split("\n\n", 1)[0]
        return {line.split()[0] for line in section.splitlines() if line.strip()}

    def check(self, argv):
        """argv: the words after `modelstatectl`."""
        t = self.test
        commands = self.commands()
        words = [w for w in argv if not w.startswith("-")]
        command = next((w for w in words if w in commands), None)
        t.assertIsNotNone(command, "no modelstatectl command in %s" % argv)
        text = run_help(CLI_BINARY, command, "--help")
        usage = text.splitlines()[0]
        for w in argv:
            if w.startswith("--"):
                t.assertRegex(text, r"(^|\s)%s(\s|$)" % re.escape(w.split("=")[0]),
                              "modelstatectl %s has no option %s" % (command, w))
        # An action word such as `audit tail` must be in the usage line.
        after = words[words.index(command) + 1:]
        if after and re.search(r"\b\w+\|\w+", usage):
            t.assertRegex(usage, r"[\s|]%s[\s|]" % re.escape(after[0]),
                          "modelstatectl %s has no action %s" % (command, after[0]))
        return command


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stages = parse_dockerfile(read(os.path.join(ROOT, "Dockerfile")))
        cls.build_stages = cls.stages[:-1]
        cls.runtime = cls.stages[-1]

    def test_stages_are_debian_bookworm_slim(self):
        self.assertGreaterEqual(len(self.stages), 2, "not multi-stage")
        for stage in self.stages:
            self.assertEqual(stage["from"], "debian:bookworm-slim")

    def test_build_steps_go_through_ci_scripts(self):
        builds = 0
        for stage in self.build_stages:
            copied = []
            for instr, args in stage["steps"]:
                if instr == "COPY":
                    copied += args.split()[:-1]
                if instr != "RUN":
                    continue
                uses_script = DEPLOY_SCRIPT.search(args)
                if INSTALL_OR_BUILD.search(args):
                    self.assertTrue(uses_script,
                                    "build-stage RUN bypasses deploy/: %s" % args)
                if uses_script:
                    # The scripts must be in the image before they run, and
                    # a build needs the whole source tree.
                    self.assertTrue(
                        "." in copied or {"deploy/common.sh", "deploy/build.sh"}
                        <= set(copied), "RUN before its scripts are copied: %s" % args)
                    if "--packages-only" not in args or "ms_build" in args:
                        self.assertIn(".", copied, "build before COPY . : %s" % args)
                        builds += 1
        self.assertGreaterEqual(builds, 1, "no build stage builds through deploy/")

    def test_build_script_is_what_ci_uses(self):
        build_sh = read(os.path.join(DEPLOY, "build.sh"))
        test_sh = read(os.path.join(DEPLOY, "test.sh"))
        common = read(os.path.join(DEPLOY, "common.sh"))
        self.assertRegex(read(os.path.join(ROOT, ".ci", "run")), r"deploy/test\.sh")
        self.assertRegex(test_sh, SOURCES_COMMON, "deploy/test.sh must source common.sh")
        self.assertRegex(build_sh, SOURCES_COMMON, "deploy/build.sh must source common.sh")
        for fn in ("ms_install_packages", "ms_build"):
            self.assertRegex(common, r"(?m)^%s\(\)" % fn)
        self.assertRegex(
            build_sh,
            r'ms_install_packages "\$\{MODELSTATE_RUNTIME_BUILD_PACKAGES\[@\]\}"')
        self.assertRegex(build_sh, r"ms_build .* Release .*-DMODELSTATE_BUILD_TESTS=OFF")
        self.assertRegex(read(os.path.join(ROOT, "CMakeLists.txt")),
                         r"option\(MODELSTATE_BUILD_TESTS\b")
        # The Dockerfile runs it directly, so it must be executable.
        self.assertTrue(os.access(os.path.join(DEPLOY, "build.sh"), os.X_OK))

    def build_dir(self):
        """Where the build stage's deploy/build.sh builds (absolute)."""
        for stage in self.build_stages:
            workdir = "/"
            for instr, args in stage["steps"]:
                if instr == "WORKDIR":
                    workdir = posixpath.join(workdir, args)
                m = re.search(r"deploy/build\.sh\s+([^\s;&|-]\S*)", args) \
                    if instr == "RUN" else None
                if m:
                    return stage["name"], posixpath.join(workdir, m.group(1))
        self.fail("no RUN deploy/build.sh BUILD_DIR in a build stage")

    def test_runtime_copies_the_built_binaries(self):
        stage_name, build_dir = self.build_dir()
        copies = {}
        for args in steps(self.runtime, "COPY"):
            words = args.split()
            self.assertEqual(words[0], "--from=%s" % stage_name,
                             "runtime COPY not from the build stage: %s" % args)
            copies[posixpath.basename(words[-1])] = (words[1], words[-1])
        # The paths the CMake build tree really uses (cf. ctest's binaries).
        for name, rel in (("modelstate-server", "server/modelstate-server"),
                          ("modelstatectl", "client/modelstatectl")):
            self.assertIn(name, copies)
            self.assertEqual(copies[name][0], posixpath.join(build_dir, rel))
        for binary, rel in ((SERVER_BINARY, "server/modelstate-server"),
                            (CLI_BINARY, "client/modelstatectl")):
            if binary:
                self.assertTrue(binary.endswith("/" + rel), binary)
        entry = exec_form(steps(self.runtime, "ENTRYPOINT")[-1])
        self.assertEqual(entry[0], copies["modelstate-server"][1])

    def runtime_packages(self):
        pkgs = []
        for args in steps(self.runtime, "RUN"):
            pkgs += apt_installed(args)
        self.assertTrue(pkgs, "the runtime stage installs no libraries")
        return pkgs

    def test_runtime_installs_no_build_packages(self):
        build = bash_array(read(os.path.join(DEPLOY, "common.sh")),
                           "MODELSTATE_RUNTIME_BUILD_PACKAGES")
        self.assertTrue(build)
        for pkg in self.runtime_packages():
            self.assertFalse(pkg.endswith("-dev"), "runtime installs %s" % pkg)
            # ca-certificates is the one package both stages need.
            if pkg != "ca-certificates":
                self.assertNotIn(pkg, build, "runtime installs build package %s" % pkg)

    @unittest.skipUnless(SERVER_BINARY and CLI_BINARY and shutil.which("ldd")
                         and shutil.which("dpkg-query"),
                         "needs both binaries, ldd and dpkg")
    def test_runtime_packages_provide_every_loaded_library(self):
        # What apt installs for the runtime list: the packages and their
        # Depends, recursively, as this machine's dpkg knows them.
        depends = {}
        listing = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package}\t${Depends},${Pre-Depends}\n"],
            stdout=subprocess.PIPE, text=True, check=True).stdout
        for line in listing.splitlines():
            pkg, _, deps = line.partition("\t")
            depends.setdefault(pkg, set()).update(
                d.strip().split(" ")[0].split(":")[0] for d in re.split(r"[,|]", deps))
        provided, todo = set(), list(self.runtime_packages())
        while todo:
            pkg = todo.pop()
            if pkg and pkg not in provided:
                provided.add(pkg)
                todo += depends.get(pkg, ())
        libs = {}
        for binary in (SERVER_BINARY, CLI_BINARY):
            ldd = subprocess.run(["ldd", binary], stdout=subprocess.PIPE,
                                 text=True, check=True).stdout
            for lib in re.findall(r"=> (/\S+)", ldd):
                libs[lib] = os.path.basename(binary)
        # The image ships Release builds; a sanitizer build loads more.
        if any(re.match(r"lib[a-z]*san\.", os.path.basename(l)) for l in libs):
            self.skipTest("a sanitizer build")
        owners = self.owners(libs)
        for lib, binary in sorted(libs.items()):
            self.assertIn(lib, owners, "no package owns %s" % lib)
            self.assertIn(owners[lib], provided,
                          "%s loads %s from %s, which the runtime stage does not "
                          "install" % (binary, lib, owners[lib]))

    @staticmethod
    def owners(libs):
        """{library path: the package that owns it} (one dpkg-query call)."""
        names = {}
        for lib in libs:
            real = os.path.realpath(lib)
            for path in (lib, real):  # merged /usr: dpkg may know either name
                for variant in (path, path[4:] if path.startswith("/usr/")
                                else "/usr" + path):
                    names.setdefault(variant, lib)
        out = subprocess.run(["dpkg-query", "-S"] + sorted(names),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True).stdout
        owners = {}
        for line in out.splitlines():
            pkgs, sep, path = line.partition(": ")
            if sep and not line.startswith("diversion") and path in names:
                owners[names[path]] = pkgs.split(",")[0].split(":")[0].strip()
        return owners

    def test_runtime_is_non_root_with_data_port_and_healthcheck(self):
        users = steps(self.runtime, "USER")
        self.assertTrue(users, "no USER: the server would run as root")
        user = users[-1].split(":")[0]
        self.assertNotIn(user, ("root", "0"))
        self.assertEqual(user, "10001", "Kubernetes' runAsUser names this uid")
        volumes = [v for args in steps(self.runtime, "VOLUME") for v in exec_form(args)]
        self.assertIn("/data", volumes)
        exposed = [p.split("/")[0] for args in steps(self.runtime, "EXPOSE")
                   for p in args.split()]
        self.assertIn("50051", exposed)
        checks = steps(self.runtime, "HEALTHCHECK")
        self.assertEqual(len(checks), 1)
        self.assertRegex(checks[0], r"\bCMD\b.*\bmodelstatectl\b.*\bhealth\b")

    def test_entrypoint_and_default_arguments(self):
        entry = exec_form(steps(self.runtime, "ENTRYPOINT")[-1])
        cmd = exec_form(steps(self.runtime, "CMD")[-1])
        args = entry[1:] + cmd
        self.assertEqual(flag_value(args, "data_dir"), "/data")
        listen = flag_value(args, "listen")
        self.assertEqual(port_of(listen), 50051)
        # Off loopback the server starts only with a token file, and without
        # TLS only with --plaintext, which must then be an explicit default.
        if not listen.startswith("127."):
            self.assertIsNotNone(flag_value(args, "token_file"))
            if flag_value(args, "tls_cert_file") is None:
                self.assertIn("--plaintext", cmd)

    @unittest.skipUnless(SERVER_BINARY, "MODELSTATE_SERVER_BINARY not set")
    def test_entrypoint_flags_are_server_flags(self):
        args = exec_form(steps(self.runtime, "ENTRYPOINT")[-1])[1:] + \
            exec_form(steps(self.runtime, "CMD")[-1])
        known = server_flags()
        self.assertIn("listen", known)  # the --helpfull parsing works
        missing = [a for a in args if flag_name(a) not in known]
        self.assertEqual(missing, [], "flags modelstate-server does not have")

    @unittest.skipUnless(CLI_BINARY, "MODELSTATE_CLI_BINARY not set")
    def test_healthcheck_command_exists(self):
        check = steps(self.runtime, "HEALTHCHECK")[0]
        words = shlex.split(check.split("CMD", 1)[1])
        self.assertEqual(CliCheck(self).check(words[1:]), "health")

    def test_dockerignore(self):
        patterns = [l.strip() for l in read(os.path.join(ROOT, ".dockerignore")).splitlines()
                    if l.strip() and not l.startswith("#")]
        for needed in ("build*/", "data/", ".git"):
            self.assertIn(needed, patterns)


def mounts(service):
    """{container path: (source, mode)} of a compose service's volumes."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, mode = (volume.split(":") + [""])[:3]
        out[target.rstrip("/")] = (source, mode)
    return out


class ComposeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.services = yaml.safe_load(read(os.path.join(DEPLOY, "compose.yaml")))["services"]
        runtime = parse_dockerfile(read(os.path.join(ROOT, "Dockerfile")))[-1]
        cls.image_cmd = exec_form(steps(runtime, "CMD")[-1])

    def check_made_by_tokens_service(self, service, path):
        """`path`, as `service` sees it, is a file the tokens service makes."""
        directory, name = posixpath.split(path)
        self.assertIn(directory, mounts(self.services[service]), path)
        volume = mounts(self.services[service])[directory][0]
        tokens = self.services["tokens"]
        made_in = {source: target for target, (source, _) in mounts(tokens).items()}
        self.assertIn(volume, made_in, "%s is not the tokens service's volume" % path)
        script = tokens["entrypoint"][-1]
        self.assertRegex(script, r"(?m)^cd %s$" % re.escape(made_in[volume]))
        if name.endswith(".token"):
            self.assertRegex(script, r"(?m)^for who in .*\b%s\b" % re.escape(name[:-6]))
        else:
            self.assertRegex(script, r"(?m)^mv \S+ %s$" % re.escape(name))

    def test_services_build_this_repository(self):
        self.assertLessEqual({"server", "policy", "audit-tail"}, set(self.services))
        for name, svc in self.services.items():
            context = os.path.normpath(os.path.join(DEPLOY, svc["build"]["context"]))
            self.assertEqual(context, ROOT, name)
            self.assertTrue(os.path.isfile(os.path.join(context, svc["build"]["dockerfile"])))
            self.assertEqual(svc["image"], self.services["server"]["image"], name)

    def test_server(self):
        server = self.services["server"]
        self.assertNotIn("entrypoint", server)
        self.assertNotIn("healthcheck", server)  # the image's check gates the others
        for port in server["ports"]:
            self.assertTrue(str(port).startswith("127.0.0.1:"),
                            "plaintext port published beyond loopback: %s" % port)
        self.assertIn("127.0.0.1:50051:50051", server["ports"])
        self.assertIn("/data", mounts(server))
        # Off loopback the server needs a token file: the image's default
        # one, made before the server starts.
        self.assertNotIn("command", server)
        self.check_made_by_tokens_service("server", flag_value(self.image_cmd, "token_file"))
        self.assertEqual(server["depends_on"]["tokens"]["condition"],
                         "service_completed_successfully")

    def client_argv(self, name):
        svc = self.services[name]
        self.assertEqual(svc["depends_on"]["server"]["condition"], "service_healthy")
        # The image's health check asks 127.0.0.1, where no server runs here.
        self.assertTrue(svc["healthcheck"].get("disable"), name)
        # The image's CMD holds server flags, which must not reach the CLI.
        self.assertEqual(svc["command"], [], name)
        entry = svc["entrypoint"]
        self.assertEqual(entry[0], "modelstatectl")
        self.assertEqual(entry[entry.index("--server") + 1], "server:50051")
        self.check_made_by_tokens_service(name, entry[entry.index("--token-file") + 1])
        return entry[1:]

    def test_policy_subscriber_mounts_a_real_policy(self):
        argv = self.client_argv("policy")
        self.assertIn("subscribe", argv)
        policy = argv[argv.index("--policy") + 1]
        found = False
        for target, (source, mode) in mounts(self.services["policy"]).items():
            if policy.startswith(target + "/"):
                self.assertEqual(mode, "ro")
                path = os.path.join(DEPLOY, source, policy[len(target):].lstrip("/"))
                self.assertTrue(os.path.isfile(path), path)
                rules = json.loads(read(path))
                self.assertIn("subscription", rules)
                self.assertIn("rules", rules)
                found = True
        self.assertTrue(found, "%s is not on a mounted volume" % policy)

    def run_tokens_script(self, directory):
        """Runs the tokens service's script as compose would ($$ is compose's
        escape for $), into `directory` instead of the volume."""
        tokens = self.services["tokens"]
        self.assertEqual(tokens["entrypoint"][:2], ["sh", "-c"])
        self.assertEqual(tokens["command"], [])
        target = list(mounts(tokens))[0]
        script = tokens["entrypoint"][2]
        self.assertNotIn("$", script.replace("$$", ""),
                         "compose would substitute a lone $ from its environment")
        script = script.replace("$$", "$")
        script = script.replace("cd %s\n" % target, "cd %s\n" % directory)
        if os.geteuid() != 0:  # chown needs root, as in the container
            script = re.sub(r"(?m)^chown .*$", ":", script)
        subprocess.run(["sh", "-c", script], check=True)

    def test_tokens_script_makes_matching_tokens(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.run_tokens_script(tmp)
            first = read(os.path.join(tmp, "admin.token"))
            self.run_tokens_script(tmp)  # a restart keeps the tokens
            self.assertEqual(read(os.path.join(tmp, "admin.token")), first)
            policy = json.loads(read(os.path.join(tmp, "tokens.json")))
            by_identity = {p["identity"]: p for p in policy["principals"]}
            roles = {"admin": "admin", "policy": "reviewer", "audit": "auditor"}
            self.assertEqual(set(by_identity), set(roles))
            for identity, role in roles.items():
                token = read(os.path.join(tmp, identity + ".token"))
                self.assertRegex(token, r"^[0-9a-f]{64}$")
                self.assertEqual(by_identity[identity]["token_sha256"],
                                 hashlib.sha256(token.encode()).hexdigest())
                self.assertEqual(by_identity[identity]["roles"], {role: ["*"]})

    @unittest.skipUnless(SERVER_BINARY and CLI_BINARY, "needs both binaries")
    def test_server_accepts_the_tokens(self):
        # The token file format belongs to the server: start it on the file
        # (loopback, free port) and call it with the tokens.
        with tempfile.TemporaryDirectory() as tmp:
            self.run_tokens_script(tmp)
            ready, log = os.path.join(tmp, "ready"), os.path.join(tmp, "log")
            with open(log, "w") as out:
                server = subprocess.Popen(
                    [SERVER_BINARY, "--listen=127.0.0.1:0", "--data_dir=%s/data" % tmp,
                     "--token_file=%s/tokens.json" % tmp, "--ready_file=" + ready],
                    stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 30
                while not (os.path.exists(ready) and read(ready).strip()):
                    if server.poll() is not None:
                        self.fail("the server exited: %s" % read(log))
                    self.assertLess(time.monotonic(), deadline, "server not ready")
                    time.sleep(0.05)
                address = read(ready).strip()

                def cli(token, *argv):
                    return subprocess.run(
                        [CLI_BINARY, "--server", address, "--token-file",
                         os.path.join(tmp, token + ".token")] + list(argv),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=60)

                for token, argv in (("admin", ["ls"]), ("audit", ["audit", "query"])):
                    done = cli(token, *argv)
                    self.assertEqual(done.returncode, 0, done.stdout)
                denied = cli("policy", "ls")
                self.assertEqual(denied.returncode, 1)
                self.assertIn("PERMISSION_DENIED", denied.stdout)
            finally:
                server.terminate()
                server.wait(timeout=60)

    def test_audit_tail_follows_the_log(self):
        argv = self.client_argv("audit-tail")
        self.assertEqual(argv[argv.index("audit") + 1], "tail")

    @unittest.skipUnless(CLI_BINARY, "MODELSTATE_CLI_BINARY not set")
    def test_cli_commands_and_options_exist(self):
        cli = CliCheck(self)
        self.assertEqual(cli.check(self.client_argv("policy")), "subscribe")
        self.assertEqual(cli.check(self.client_argv("audit-tail")), "audit")


class KubernetesTest(unittest.TestCase):
    KINDS = {
        "statefulset.yaml": ["StatefulSet"],
        "service.yaml": ["Service", "Service"],
        "configmap.yaml": ["ConfigMap"],
        "secret.yaml": ["Secret", "Secret"],
        "networkpolicy.yaml": ["NetworkPolicy"],
    }

    @classmethod
    def setUpClass(cls):
        cls.docs = {f: yaml_docs(os.path.join(K8S, f)) for f in cls.KINDS}
        cls.sts = cls.docs["statefulset.yaml"][0]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        cls.container = cls.pod["containers"][0]
        cls.configmap = cls.docs["configmap.yaml"][0]
        cls.secrets = {s["metadata"]["name"]: s for s in cls.docs["secret.yaml"]}
        cls.mounts = {m["mountPath"]: m for m in cls.container["volumeMounts"]}
        cls.volumes = {v["name"]: v for v in cls.pod["volumes"]}
        cls.flags = cls.flagfile_flags()

    @classmethod
    def flagfile_flags(cls):
        """The server's flags: the ConfigMap file that --flagfile names."""
        path = flag_value(cls.container["args"], "flagfile")
        assert path, "the container does not pass --flagfile"
        mount = cls.mounts[posixpath.dirname(path)]
        volume = cls.volumes[mount["name"]]
        assert volume["configMap"]["name"] == cls.configmap["metadata"]["name"]
        text = cls.configmap["data"][posixpath.basename(path)]
        return [l.strip() for l in text.splitlines()
                if l.strip() and not l.strip().startswith("#")]

    def test_manifests_have_the_expected_kinds(self):
        for f, kinds in self.KINDS.items():
            self.assertEqual([d["kind"] for d in self.docs[f]], kinds, f)
            for d in self.docs[f]:
                self.assertIn("apiVersion", d)
                self.assertIn("name", d["metadata"])

    def test_kustomization_lists_everything_but_the_example_secret(self):
        k = yaml.safe_load(read(os.path.join(K8S, "kustomization.yaml")))
        self.assertEqual(k["kind"], "Kustomization")
        manifests = {f for f in os.listdir(K8S) if f.endswith(".yaml")}
        # Applying placeholder Secrets would overwrite the real ones.
        self.assertEqual(set(k["resources"]),
                         manifests - {"kustomization.yaml", "secret.yaml"})

    def test_statefulset_storage_and_resources(self):
        claims = [c["metadata"]["name"] for c in self.sts["spec"]["volumeClaimTemplates"]]
        data_dir = flag_value(self.flags, "data_dir") or "/data"
        self.assertEqual(data_dir, "/data")
        self.assertIn(self.mounts[data_dir]["name"], claims)
        self.assertIn("emptyDir", self.volumes[self.mounts["/tmp"]["name"]])
        resources = self.container["resources"]
        for part in ("requests", "limits"):
            self.assertLessEqual({"cpu", "memory"}, set(resources[part]), part)
        self.assertEqual(self.sts["spec"]["replicas"], 1)

    def test_statefulset_security_context(self):
        sc, psc = self.container["securityContext"], self.pod["securityContext"]
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertIn("ALL", sc["capabilities"]["drop"])
        self.assertIs(sc.get("runAsNonRoot", psc.get("runAsNonRoot")), True)
        uid = sc.get("runAsUser", psc.get("runAsUser"))
        dockerfile = parse_dockerfile(read(os.path.join(ROOT, "Dockerfile")))
        self.assertEqual(str(uid), steps(dockerfile[-1], "USER")[-1].split(":")[0])
        self.assertIn("fsGroup", psc)
        for mount in self.container["volumeMounts"]:
            if mount["mountPath"] not in ("/data", "/tmp"):
                self.assertIs(mount.get("readOnly"), True, mount["mountPath"])

    def test_grpc_probes_use_the_health_listener(self):
        health_port = port_of(flag_value(self.flags, "health_listen"))
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.assertEqual(ports["health"], health_port)
        self.assertEqual(ports["grpc"], port_of(flag_value(self.flags, "listen")))
        self.assertNotEqual(health_port, ports["grpc"])
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertEqual(self.container[probe]["grpc"]["port"], health_port, probe)

    def test_tls_and_token_files_come_from_the_secrets(self):
        self.assertNotIn("--plaintext", self.flags)
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "token_file"):
            path = flag_value(self.flags, name)
            self.assertIsNotNone(path, "--%s missing" % name)
            volume = self.volumes[self.mounts[posixpath.dirname(path)]["name"]]
            secret = self.secrets[volume["secret"]["secretName"]]
            keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
            self.assertIn(posixpath.basename(path), keys, name)
        for secret in self.secrets.values():
            for value in secret.get("stringData", {}).values():
                self.assertNotIn("PRIVATE KEY", value, "a real key in the example")

    def test_shutdown_grace_fits_the_termination_grace(self):
        grace = int(flag_value(self.flags, "shutdown_grace_seconds") or 10)
        self.assertLess(grace, self.pod.get("terminationGracePeriodSeconds", 30))

    @unittest.skipUnless(SERVER_BINARY, "MODELSTATE_SERVER_BINARY not set")
    def test_configmap_flags_are_server_flags(self):
        assert_server_flags(self, self.flags, self.container["args"])

    def test_services_select_the_pod(self):
        labels = self.sts["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(self.sts["spec"]["selector"]["matchLabels"].items(),
                             labels.items())
        services = {s["metadata"]["name"]: s for s in self.docs["service.yaml"]}
        headless = services[self.sts["spec"]["serviceName"]]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertTrue(any(s["spec"].get("type", "ClusterIP") == "ClusterIP"
                            and s["spec"].get("clusterIP") != "None"
                            for s in services.values()))
        port_names = {p["name"] for p in self.container["ports"]}
        for s in services.values():
            self.assertLessEqual(s["spec"]["selector"].items(), labels.items())
            for p in s["spec"]["ports"]:
                self.assertIn(p["targetPort"], port_names)

    def test_network_policy(self):
        policy = self.docs["networkpolicy.yaml"][0]["spec"]
        labels = self.sts["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(policy["podSelector"]["matchLabels"].items(), labels.items())
        self.assertIn("Ingress", policy["policyTypes"])
        open_ports = set()
        for rule in policy["ingress"]:
            self.assertIn("ports", rule, "a rule without ports opens every port")
            ports = {p["port"] for p in rule["ports"]}
            if 50051 in ports:
                self.assertTrue(rule["from"])
                for peer in rule["from"]:
                    self.assertEqual(set(peer), {"podSelector"})
                    self.assertEqual(peer["podSelector"]["matchLabels"],
                                     {"modelstate-client": "true"})
            elif 9464 in ports:
                # Metrics: only the monitoring stack's scrapers, from any
                # namespace.
                self.assertEqual(ports, {9464})
                self.assertTrue(rule["from"])
                for peer in rule["from"]:
                    self.assertEqual(peer["podSelector"]["matchLabels"],
                                     {"prometheus-scraper": "true"})
            else:
                self.assertEqual(ports, {50052}, "only the health port is open to all")
            open_ports |= ports
        self.assertEqual(open_ports, {50051, 50052, 9464})

    def test_metrics_port_is_annotated_for_prometheus(self):
        metrics_port = port_of(flag_value(self.flags, "metrics_listen"))
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.assertEqual(ports["metrics"], metrics_port)
        annotations = self.sts["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(annotations["prometheus.io/port"], str(metrics_port))
        self.assertEqual(annotations["prometheus.io/path"], "/metrics")
        self.assertEqual(flag_value(self.flags, "log_format"), "json")


# ----------------------------------------------------------- cluster files --
# The merge keys of the lists that the cluster overlay's strategic merge
# patch touches (Kubernetes' API declares them); any other list is replaced.
MERGE_KEYS = {"containers": "name", "env": "name", "volumeMounts": "mountPath",
              "volumes": "name", "ports": "containerPort"}


def strategic_merge(base, patch):
    """`patch` over `base` as a strategic merge patch applies it, for the
    fields used here: maps merge, lists with a merge key merge item by
    item, other lists (args) and scalars are replaced."""
    if not (isinstance(base, dict) and isinstance(patch, dict)):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if key not in out:
            out[key] = value
        elif key in MERGE_KEYS and isinstance(value, list):
            merge_key = MERGE_KEYS[key]
            merged = list(out[key])
            index = {item[merge_key]: i for i, item in enumerate(merged)}
            for item in value:
                if item[merge_key] in index:
                    i = index[item[merge_key]]
                    merged[i] = strategic_merge(merged[i], item)
                else:
                    merged.append(item)
            out[key] = merged
        else:
            out[key] = strategic_merge(out[key], value)
    return out


def kustomize(directory):
    """The objects `kubectl apply -k directory` would apply: resources
    (files, and directories as bases) and strategic merge patches; the
    other transformers (images) are left out."""
    k = yaml.safe_load(read(os.path.join(directory, "kustomization.yaml")))
    docs = []
    for resource in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, resource))
        if os.path.isdir(path):
            # kustomize refuses a base at or above the kustomization: a
            # "cycle" to it.
            here = os.path.realpath(directory)
            base = os.path.realpath(path)
            assert not (here == base or here.startswith(base + os.sep)), \
                "%s: base %s contains the kustomization" % (directory, resource)
            docs += kustomize(path)
        else:
            docs += yaml_docs(path)
    for entry in k.get("patches", []):
        for patch in yaml_docs(os.path.join(directory, entry["path"])):
            targets = [i for i, d in enumerate(docs)
                       if (d["kind"], d["metadata"]["name"])
                       == (patch["kind"], patch["metadata"]["name"])]
            assert len(targets) == 1, "patch %s matches %d objects" % (
                entry["path"], len(targets))
            docs[targets[0]] = strategic_merge(docs[targets[0]], patch)
    return docs


def selects(selector, labels):
    """Whether a label selector (matchLabels only) selects `labels`."""
    assert set(selector) <= {"matchLabels"}, "unsupported selector %s" % selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def ingress_allowed(policies, source, target, port):
    """Whether NetworkPolicies (one namespace) let a pod labelled `source`
    reach a pod labelled `target` on TCP `port`, both in that namespace.
    Policies add up; a pod no policy selects accepts everything."""
    selecting = [p["spec"] for p in policies
                 if selects(p["spec"]["podSelector"], target)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for spec in selecting:
        for rule in spec.get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(
                    p.get("protocol", "TCP") == "TCP" and p.get("port") == port
                    for p in ports):
                continue
            if not rule.get("from"):
                return True
            for peer in rule["from"]:
                assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
                # An empty namespaceSelector is every namespace, this one too.
                assert peer.get("namespaceSelector", {}) == {}, peer
                if selects(peer.get("podSelector", {}), source):
                    return True
    return False


def url_host_port(url):
    """("host", port) of http://host:port."""
    m = re.match(r"^https?://([^:/]+):(\d+)$", url)
    assert m, "not http://host:port: %s" % url
    return m.group(1), int(m.group(2))


class KubernetesClusterTest(unittest.TestCase):
    """deploy/k8s-cluster, the overlay for three replicas and etcd."""

    @classmethod
    def setUpClass(cls):
        cls.kustomization = yaml.safe_load(
            read(os.path.join(K8S_CLUSTER, "kustomization.yaml")))
        cls.docs = kustomize(K8S_CLUSTER)
        cls.by_id = {(d["kind"], d["metadata"]["name"]): d for d in cls.docs}
        cls.sts = cls.by_id[("StatefulSet", "modelstate")]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        cls.container = [c for c in cls.pod["containers"] if c["name"] == "server"][0]
        cls.mounts = {m["mountPath"]: m for m in cls.container["volumeMounts"]}
        cls.volumes = {v["name"]: v for v in cls.pod["volumes"]}
        cls.etcd = cls.by_id[("StatefulSet", "modelstate-etcd")]
        cls.etcd_pod = cls.etcd["spec"]["template"]["spec"]
        cls.etcd_container = cls.etcd_pod["containers"][0]
        cls.etcd_args = cls.etcd_container.get("command", [])[1:] + \
            cls.etcd_container.get("args", [])
        cls.example_secrets = {
            s["metadata"]["name"]: s
            for s in yaml_docs(os.path.join(K8S_CLUSTER, "secret.yaml"))}
        # The flags of each --flagfile, by file name, in order.
        cls.flagfiles = {}
        for arg in cls.container["args"]:
            if arg.startswith("--flagfile="):
                path = arg.split("=", 1)[1]
                volume = cls.volumes[cls.mounts[posixpath.dirname(path)]["name"]]
                configmap = cls.by_id[("ConfigMap", volume["configMap"]["name"])]
                text = configmap["data"][posixpath.basename(path)]
                cls.flagfiles[posixpath.basename(path)] = [
                    l.strip() for l in text.splitlines()
                    if l.strip() and not l.strip().startswith("#")]
        cls.cluster_flags = cls.flagfiles.get("cluster.flags", [])
        # Everything the server is given; later flags win.
        cls.flags = [f for flags in cls.flagfiles.values() for f in flags] + \
            [a for a in cls.container["args"] if not a.startswith("--flagfile=")]

    def env(self, container):
        return {e["name"]: e for e in container.get("env", [])}

    def test_kustomization_lists_its_resources(self):
        k = self.kustomization
        self.assertEqual(k["kind"], "Kustomization")
        here = os.path.realpath(K8S_CLUSTER)
        files = set()
        for resource in k["resources"]:
            path = os.path.realpath(os.path.join(K8S_CLUSTER, resource))
            if os.path.isdir(path):
                self.assertTrue(os.path.isfile(os.path.join(path, "kustomization.yaml")),
                                resource)
                # kustomize refuses a base at or above the overlay ("cycle").
                self.assertFalse(here == path or here.startswith(path + os.sep),
                                 "base %s contains the overlay" % resource)
            else:
                # ...and, by default, files from outside the overlay.
                self.assertEqual(os.path.dirname(path), here, resource)
                files.add(os.path.basename(path))
        self.assertIn(os.path.realpath(K8S), [os.path.realpath(os.path.join(K8S_CLUSTER, r))
                                              for r in k["resources"]])
        patches = set()
        for entry in k["patches"]:
            self.assertEqual(set(entry), {"path"}, "a strategic merge patch file")
            self.assertTrue(os.path.isfile(os.path.join(K8S_CLUSTER, entry["path"])))
            patches.add(entry["path"])
        manifests = {f for f in os.listdir(K8S_CLUSTER) if f.endswith(".yaml")}
        # Applying the placeholder Secret would overwrite the real one.
        self.assertEqual(files, manifests - patches - {"kustomization.yaml", "secret.yaml"})
        # kustomize refuses two objects with one kind and name.
        ids = [(d["kind"], d["metadata"]["name"]) for d in self.docs]
        self.assertEqual(len(ids), len(set(ids)))

    def test_statefulset_runs_three_replicas(self):
        self.assertEqual(self.sts["spec"]["replicas"], 3)
        base = yaml_docs(os.path.join(K8S, "statefulset.yaml"))[0]
        self.assertEqual(base["spec"]["replicas"], 1)
        # The patch adds to the base's pod; it keeps its volumes and flags.
        base_container = base["spec"]["template"]["spec"]["containers"][0]
        for mount in base_container["volumeMounts"]:
            self.assertIn(mount["mountPath"], self.mounts)
        self.assertEqual(self.container["args"][0], base_container["args"][0])
        self.assertEqual(list(self.flagfiles), ["server.flags", "cluster.flags"])

    @unittest.skipUnless(SERVER_BINARY, "MODELSTATE_SERVER_BINARY not set")
    def test_cluster_flags_are_server_flags(self):
        self.assertTrue(self.cluster_flags)
        assert_server_flags(self, self.cluster_flags, self.container["args"])

    def etcd_service(self):
        service = self.by_id[("Service", self.etcd["spec"]["serviceName"])]
        self.assertEqual(service["spec"]["clusterIP"], "None")
        # The members find each other by name before any is ready.
        self.assertIs(service["spec"].get("publishNotReadyAddresses"), True)
        labels = self.etcd["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(selects({"matchLabels": service["spec"]["selector"]}, labels))
        return service["metadata"]["name"]

    def etcd_port(self, name):
        ports = {p["name"]: p["containerPort"] for p in self.etcd_container["ports"]}
        return ports[name]

    def etcd_pods(self):
        return ["%s-%d" % (self.etcd["metadata"]["name"], i)
                for i in range(self.etcd["spec"]["replicas"])]

    def test_etcd_endpoints_name_the_etcd_pods(self):
        service = self.etcd_service()
        client = self.etcd_port("client")
        self.assertEqual(port_of(flag_value(self.etcd_args, "listen-client-urls")), client)
        endpoints = flag_value(self.cluster_flags, "etcd_endpoints").split(",")
        self.assertEqual(endpoints,
                         ["%s.%s:%d" % (pod, service, client) for pod in self.etcd_pods()])
        self.assertEqual(len(endpoints), 3)

    def test_etcd_initial_cluster_names_the_same_pods(self):
        service = self.etcd_service()
        peer = self.etcd_port("peer")
        self.assertEqual(port_of(flag_value(self.etcd_args, "listen-peer-urls")), peer)
        members = dict(m.split("=", 1)
                       for m in flag_value(self.etcd_args, "initial-cluster").split(","))
        self.assertEqual(sorted(members), self.etcd_pods())
        for pod, url in members.items():
            self.assertEqual(url_host_port(url), ("%s.%s" % (pod, service), peer))
        # Each member names itself as --initial-cluster names it.
        self.assertEqual(flag_value(self.etcd_args, "name"), "$(POD_NAME)")
        self.assertEqual(flag_value(self.etcd_args, "initial-advertise-peer-urls"),
                         "http://$(POD_NAME).%s:%d" % (service, peer))
        self.assertEqual(flag_value(self.etcd_args, "advertise-client-urls"),
                         "http://$(POD_NAME).%s:%d" % (service, self.etcd_port("client")))
        pod_name = self.env(self.etcd_container)["POD_NAME"]
        self.assertEqual(pod_name["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(flag_value(self.etcd_args, "initial-cluster-state"), "new")
        # A new cluster needs its quorum before any member is ready.
        self.assertEqual(self.etcd["spec"]["podManagementPolicy"], "Parallel")

    def test_etcd_statefulset(self):
        c, psc = self.etcd_container, self.etcd_pod["securityContext"]
        self.assertEqual(c["image"], "quay.io/coreos/etcd:v3.4.27")
        sc = c["securityContext"]
        self.assertIs(sc.get("runAsNonRoot", psc.get("runAsNonRoot")), True)
        self.assertNotEqual(sc.get("runAsUser", psc.get("runAsUser")), 0)
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertIn("ALL", sc["capabilities"]["drop"])
        self.assertIn("fsGroup", psc)
        self.assertIs(self.etcd_pod.get("automountServiceAccountToken"), False)
        # Probes run inside the pod: the NetworkPolicy keeps 2379 from
        # everyone but the servers, the kubelet too on some plugins.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            self.assertEqual(c[probe]["exec"]["command"][0], "/usr/local/bin/etcdctl", probe)
        # The data directory lies on the volume claim, below its root.
        claims = [t["metadata"]["name"] for t in self.etcd["spec"]["volumeClaimTemplates"]]
        data_dir = flag_value(self.etcd_args, "data-dir")
        mount = [m for m in c["volumeMounts"]
                 if data_dir.startswith(m["mountPath"].rstrip("/") + "/")]
        self.assertEqual(len(mount), 1, data_dir)
        self.assertIn(mount[0]["name"], claims)
        for part in ("requests", "limits"):
            self.assertLessEqual({"cpu", "memory"}, set(c["resources"][part]), part)

    def test_etcd_is_not_selected_as_modelstate(self):
        etcd_labels = self.etcd["spec"]["template"]["metadata"]["labels"]
        ms_labels = self.sts["spec"]["template"]["metadata"]["labels"]
        self.assertFalse(selects(self.sts["spec"]["selector"], etcd_labels))
        self.assertFalse(selects(self.etcd["spec"]["selector"], ms_labels))
        for d in self.docs:
            if d["kind"] == "Service" and d["metadata"]["name"] != self.etcd_service():
                self.assertFalse(selects({"matchLabels": d["spec"]["selector"]},
                                         etcd_labels), d["metadata"]["name"])

    def test_advertise_address_is_the_pod_name(self):
        headless = self.by_id[("Service", self.sts["spec"]["serviceName"])]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        port = port_of(flag_value(self.flags, "listen"))
        self.assertEqual(flag_value(self.container["args"], "advertise_address"),
                         "$(POD_NAME).%s.$(POD_NAMESPACE).svc:%d"
                         % (headless["metadata"]["name"], port))
        env = self.env(self.container)
        for name, field in (("POD_NAME", "metadata.name"),
                            ("POD_NAMESPACE", "metadata.namespace")):
            self.assertEqual(env[name]["valueFrom"]["fieldRef"]["fieldPath"], field)
        # The kubelet leaves a $(VAR) it has no value for as it is.
        for arg in self.container["args"]:
            for var in re.findall(r"\$\((\w+)\)", arg):
                self.assertIn(var, env, arg)
        # The replica id is the default, the host name: the pod's name.
        self.assertIsNone(flag_value(self.flags, "replica_id"))

    def test_cluster_secret_is_mounted_from_its_secret(self):
        path = flag_value(self.cluster_flags, "cluster_secret_file")
        mount = self.mounts[posixpath.dirname(path)]
        self.assertIs(mount.get("readOnly"), True)
        name = self.volumes[mount["name"]]["secret"]["secretName"]
        self.assertIn(name, self.example_secrets)
        placeholder = self.example_secrets[name]["stringData"][posixpath.basename(path)]
        # The server refuses a secret under 16 bytes: a placeholder applied
        # by mistake stops the server rather than becoming the secret.
        self.assertLess(len(placeholder.encode()), 16)
        self.assertRegex(read(os.path.join(K8S_CLUSTER, "secret.yaml")),
                         r"kubectl create secret generic %s\b" % re.escape(name))

    def test_cluster_ca_is_the_tls_ca(self):
        # The base's servers use TLS, so the server wants --cluster_ca_file.
        self.assertIsNotNone(flag_value(self.flags, "tls_cert_file"))
        path = flag_value(self.cluster_flags, "cluster_ca_file")
        self.assertEqual(path, flag_value(self.flags, "tls_client_ca_file"))
        volume = self.volumes[self.mounts[posixpath.dirname(path)]["name"]]
        base_secrets = {s["metadata"]["name"]: s
                        for s in yaml_docs(os.path.join(K8S, "secret.yaml"))}
        secret = base_secrets[volume["secret"]["secretName"]]
        self.assertIn(posixpath.basename(path), secret["stringData"])

    def test_network_policies(self):
        policies = [d for d in self.docs if d["kind"] == "NetworkPolicy"]
        server = self.sts["spec"]["template"]["metadata"]["labels"]
        etcd = self.etcd["spec"]["template"]["metadata"]["labels"]
        client = {"modelstate-client": "true"}
        other = {"app": "other"}
        client_port = self.etcd_port("client")
        peer_port = self.etcd_port("peer")
        api_port = port_of(flag_value(self.flags, "listen"))
        allowed = [(server, etcd, client_port), (etcd, etcd, peer_port),
                   (server, server, api_port), (client, server, api_port)]
        refused = [(client, etcd, client_port), (other, etcd, client_port),
                   (etcd, etcd, client_port), (server, etcd, peer_port),
                   (other, etcd, peer_port), (other, server, api_port),
                   (etcd, server, api_port)]
        for source, target, port in allowed:
            self.assertTrue(ingress_allowed(policies, source, target, port),
                            "%s -> %s:%d refused" % (source, target, port))
        for source, target, port in refused:
            self.assertFalse(ingress_allowed(policies, source, target, port),
                             "%s -> %s:%d let in" % (source, target, port))
        for policy in policies:
            for rule in policy["spec"]["ingress"]:
                self.assertIn("ports", rule, "a rule without ports opens every port")


def compose_argv(service, image_entrypoint):
    """The server flags a compose service runs with: the image's
    ENTRYPOINT arguments, then its command (which replaces the CMD)."""
    return image_entrypoint[1:] + list(service.get("command", []))


class ComposeClusterTest(unittest.TestCase):
    """deploy/compose-cluster.yaml, a local three-replica cluster."""

    @classmethod
    def setUpClass(cls):
        cls.path = os.path.join(DEPLOY, "compose-cluster.yaml")
        cls.compose = yaml.safe_load(read(cls.path))
        cls.services = cls.compose["services"]
        cls.single = yaml.safe_load(read(os.path.join(DEPLOY, "compose.yaml")))
        runtime = parse_dockerfile(read(os.path.join(ROOT, "Dockerfile")))[-1]
        cls.entrypoint = exec_form(steps(runtime, "ENTRYPOINT")[-1])
        cls.servers = {name: compose_argv(svc, cls.entrypoint)
                       for name, svc in cls.services.items()
                       if any(str(a).startswith("--etcd_endpoints=")
                              for a in svc.get("command", []))}

    def made_by_secrets_service(self, service, path):
        """`path`, as `service` sees it, is a file the secrets service makes
        on a volume they share."""
        directory, name = posixpath.split(path)
        self.assertIn(directory, mounts(self.services[service]), path)
        volume = mounts(self.services[service])[directory][0]
        made_in = {source: target for target, (source, _)
                   in mounts(self.services["secrets"]).items()}
        self.assertIn(volume, made_in, "%s is not on the secrets volume" % path)
        script = self.services["secrets"]["entrypoint"][-1]
        self.assertRegex(script, r"(?m)^cd %s$" % re.escape(made_in[volume]))
        self.assertRegex(script, r"(?m)(> ?|mv \S+ )%s$" % re.escape(name))

    def test_services(self):
        self.assertEqual(sorted(self.servers), ["server-1", "server-2", "server-3"])
        self.assertLessEqual({"etcd", "secrets"}, set(self.services))
        # Its own project: by default compose names both files' projects
        # after their directory, and they would share volumes.
        self.assertTrue(self.compose.get("name"))
        self.assertNotEqual(self.compose["name"], self.single.get("name", "deploy"))
        # The same image build as compose.yaml.
        single = self.single["services"]["server"]
        for name in list(self.servers) + ["secrets"]:
            svc = self.services[name]
            self.assertEqual(svc["build"], single["build"], name)
            self.assertEqual(svc["image"], single["image"], name)
        # The same etcd as the Kubernetes overlay.
        etcd = [d for d in yaml_docs(os.path.join(K8S_CLUSTER, "etcd.yaml"))
                if d["kind"] == "StatefulSet"][0]
        self.assertEqual(self.services["etcd"]["image"],
                         etcd["spec"]["template"]["spec"]["containers"][0]["image"])

    def etcd_client_port(self):
        args = self.services["etcd"]["command"]
        port = port_of(flag_value(args, "listen-client-urls"))
        self.assertEqual(url_host_port(flag_value(args, "advertise-client-urls")),
                         ("etcd", port))
        return port

    def test_servers_find_etcd_and_each_other(self):
        replica_ids, host_ports = set(), set()
        for name, argv in self.servers.items():
            svc = self.services[name]
            listen = flag_value(argv, "listen")
            self.assertEqual(listen, "0.0.0.0:50051", name)
            # Off loopback: a token file, and --plaintext without TLS.
            self.assertIn("--plaintext", svc["command"], name)
            self.made_by_secrets_service(name, flag_value(argv, "token_file"))
            self.made_by_secrets_service(name, flag_value(argv, "cluster_secret_file"))
            self.assertEqual(flag_value(argv, "etcd_endpoints"),
                             "etcd:%d" % self.etcd_client_port(), name)
            # The other replicas reach it by its service name.
            self.assertEqual(flag_value(argv, "advertise_address"),
                             "%s:%d" % (name, port_of(listen)))
            replica_ids.add(flag_value(argv, "replica_id"))
            for port in svc["ports"]:
                host, host_port, container_port = str(port).split(":")
                self.assertEqual(host, "127.0.0.1", "plaintext beyond loopback")
                self.assertEqual(int(container_port), port_of(listen))
                host_ports.add(int(host_port))
            self.assertIn("/data", mounts(svc))
            self.assertEqual(svc["depends_on"]["secrets"]["condition"],
                             "service_completed_successfully")
            self.assertEqual(svc["depends_on"]["etcd"]["condition"], "service_healthy")
            # The image's health check applies: it asks 127.0.0.1, where
            # this server listens, and health needs no token.
            self.assertNotIn("healthcheck", svc)
        self.assertNotIn(None, replica_ids)
        self.assertEqual(len(replica_ids), len(self.servers), "replica ids not distinct")
        self.assertEqual(host_ports, {50051, 50052, 50053})
        data = [mounts(self.services[n])["/data"][0] for n in self.servers]
        self.assertEqual(len(set(data)), len(data), "servers share a data volume")

    @unittest.skipUnless(SERVER_BINARY, "MODELSTATE_SERVER_BINARY not set")
    def test_server_arguments_are_server_flags(self):
        known = server_flags()
        self.assertIn("advertise_address", known)  # the --helpfull parsing works
        for name, argv in self.servers.items():
            missing = [a for a in argv if flag_name(a) not in known]
            self.assertEqual(missing, [], "%s: flags modelstate-server does not have" % name)

    def test_etcd(self):
        etcd = self.services["etcd"]
        self.assertNotIn("ports", etcd, "only the servers need etcd")
        self.assertEqual(etcd["entrypoint"], ["/usr/local/bin/etcd"])
        test = etcd["healthcheck"]["test"]
        self.assertEqual(test[:2], ["CMD", "/usr/local/bin/etcdctl"])
        self.assertEqual(test[-2:], ["endpoint", "health"])
        uid = etcd["user"].split(":")[0]
        self.assertNotEqual(uid, "0")
        # Its data directory: below a volume that the secrets service gives
        # to etcd's user.
        data_dir = flag_value(etcd["command"], "data-dir")
        volume = [(target, source) for target, (source, _) in mounts(etcd).items()
                  if data_dir.startswith(target + "/")]
        self.assertEqual(len(volume), 1, data_dir)
        target = {s: t for t, (s, _) in mounts(self.services["secrets"]).items()}[volume[0][1]]
        self.assertRegex(self.services["secrets"]["entrypoint"][-1],
                         r"(?m)^chown %s:\S+ %s$" % (uid, re.escape(target)))
        self.assertEqual(etcd["depends_on"]["secrets"]["condition"],
                         "service_completed_successfully")

    def run_secrets_script(self, tmp):
        """Runs the secrets service's script as compose would ($$ is
        compose's escape for $), with each of its volumes a directory
        under `tmp`. Returns {volume target: directory}."""
        svc = self.services["secrets"]
        self.assertEqual(svc["entrypoint"][:2], ["sh", "-c"])
        self.assertEqual(svc["command"], [])
        script = svc["entrypoint"][2]
        self.assertNotIn("$", script.replace("$$", ""),
                         "compose would substitute a lone $ from its environment")
        script = script.replace("$$", "$")
        dirs = {}
        # Every path the script names on a volume moves to a directory here
        # (longest first), so that it touches nothing on this machine.
        for i, target in enumerate(sorted(mounts(svc), key=len, reverse=True)):
            dirs[target] = os.path.join(tmp, "volume%d" % i)
            os.makedirs(dirs[target], exist_ok=True)
            script = script.replace(target, dirs[target])
        for line in script.splitlines():
            words = line.split()
            if words[:1] in (["cd"], ["chown"], ["chmod"]):
                for word in words[1:]:
                    if word.startswith("/"):
                        self.assertTrue(word.startswith(tmp + "/"), "off the volumes: " + line)
        if os.geteuid() != 0:  # chown needs root, as in the container
            script = re.sub(r"(?m)^chown .*$", ":", script)
        subprocess.run(["sh", "-c", script], check=True)
        return dirs

    def test_secrets_script_makes_the_secret_and_tokens(self):
        with tempfile.TemporaryDirectory() as tmp:
            dirs = self.run_secrets_script(tmp)
            argv = self.servers["server-1"]
            files = {}
            for flag in ("cluster_secret_file", "token_file"):
                directory, name = posixpath.split(flag_value(argv, flag))
                files[flag] = os.path.join(dirs[directory], name)
            secret = read(files["cluster_secret_file"])
            self.run_secrets_script(tmp)  # a restart keeps them
            self.assertEqual(read(files["cluster_secret_file"]), secret)
            # What the server wants: at least 16 bytes once the line ends
            # are gone.
            self.assertGreaterEqual(len(secret.rstrip("\r\n").encode()), 16)
            policy = json.loads(read(files["token_file"]))
            by_identity = {p["identity"]: p for p in policy["principals"]}
            self.assertEqual(by_identity["admin"]["roles"], {"admin": ["*"]})
            directory = os.path.dirname(files["token_file"])
            for identity, principal in by_identity.items():
                token = read(os.path.join(directory, identity + ".token"))
                self.assertRegex(token, r"^[0-9a-f]{64}$")
                self.assertEqual(principal["token_sha256"],
                                 hashlib.sha256(token.encode()).hexdigest())

    @unittest.skipUnless(CLI_BINARY, "MODELSTATE_CLI_BINARY not set")
    def test_usage_commands_exist(self):
        # The modelstatectl lines of the header comment.
        lines = [l[1:].strip() for l in read(self.path).splitlines()
                 if re.match(r"^#\s+modelstatectl\s", l)]
        self.assertTrue(lines)
        commands = set()
        for line in lines:
            argv = shlex.split(line)[1:]
            server = argv[argv.index("--server") + 1]
            self.assertIn(port_of(server), {50051, 50052, 50053})
            commands.add(CliCheck(self).check(argv))
        self.assertIn("cluster", commands)


if __name__ == "__main__":
    unittest.main()
