"""A simulated install: what the API server, Helm (or Argo CD) and a kubelet
would do with the rendered chart, played in order with local processes.

No cluster runs where toolfleet is built and tested, so this plays one:

- **Helm** (`helm install --wait`): pre-install hooks by weight, each run
  to its end before the next; then every other object; then `--wait`:
  every Deployment ready (Jobs are not waited for, as without
  `--wait-for-jobs`); then post-install hooks by weight; then `helm test`
  (the test hooks). A hook or gate that never comes is a timeout, as it
  is for Helm: a chart whose services wait for a post-install hook
  deadlocks here as it would there.
- **Argo CD** (a sync): PreSync hooks (Helm's pre-install), then each sync
  wave in order (`argocd.argoproj.io/sync-wave`, 0 by default), each wave
  applied and healthy (a Deployment ready, a Job complete) before the
  next, then PostSync hooks (Helm's post-install); Helm's test hooks are
  not Argo's.
- **The kubelet**: a pod is its containers run as processes (one replica
  per Deployment) with the image's environment and the pod's, the
  ConfigMaps and Secrets they mount as files (kube.py); every port a
  container declares becomes a free loopback port, and cluster DNS (a
  Service's short or full name) resolves to the port of the pod its
  selector picks; a pod is ready once its startup and readiness probes
  pass (HTTP on the declared port, or exec); a Job's pod is restarted on
  failure up to its backoffLimit.

Servers outside the chart (NATS and Redis in production) are started here
as an operator would run them, with the users files the chart renders.

Usage: install.py CHART_DIR BIN_DIR
"""

import hashlib
import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import bcrypt
import helm_python
import yaml

from kube import Command, Manifests
from common import certificates
from pods import Fleet, free_port

NAMESPACE = "toolfleet"
RELEASE = "tf"
TOKEN = "tok-simulated-install-5c1e"
# How long Helm's --wait (and each Argo CD wave) may take here.
TIMEOUT = 90.0
# Helm's install order of kinds (pkg/release/util/kind_sorter.go).
KIND_ORDER = ["Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodDisruptionBudget",
              "ServiceAccount", "Secret", "ConfigMap", "PersistentVolumeClaim", "Role", "RoleBinding",
              "Service", "Pod", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job"]


def hook(doc: dict) -> set[str]:
    return set(filter(None, (doc["metadata"].get("annotations") or {}).get("helm.sh/hook", "").split(",")))


def weight(doc: dict) -> int:
    return int((doc["metadata"].get("annotations") or {}).get("helm.sh/hook-weight", "0"))


def wave(doc: dict) -> int:
    return int((doc["metadata"].get("annotations") or {}).get("argocd.argoproj.io/sync-wave", "0"))


def kind_order(doc: dict) -> int:
    return KIND_ORDER.index(doc["kind"]) if doc["kind"] in KIND_ORDER else len(KIND_ORDER)


def labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# Servers whose address is not in a file toolfleet renders: the flags that
# move each port their container declares to its local port.
PORT_FLAGS = {
    "nats-server": lambda port: ["-a", "127.0.0.1", "-p", port(4222), "-m", port(8222)],
    "redis-server": lambda port: ["--port", port(6379), "--bind", "127.0.0.1"],
}


class Cluster:
    """The objects applied so far, their pods as processes, and cluster DNS."""

    def __init__(self, docs: list[dict], user_secrets: dict, fleet: Fleet, root: str, outside: dict[str, str]):
        self.docs = docs
        self.manifests = Manifests(docs, user_secrets)
        self.fleet = fleet
        self.root = root
        self.applied: list[dict] = []
        self.pods: dict[str, dict] = {}
        # (workload, container port) -> local port, for every pod to come.
        self.ports = {(d["metadata"]["name"], p["containerPort"]): free_port()
                      for d in docs if d["kind"] in ("Deployment", "Job", "Pod")
                      for c in self.spec(d)["containers"] for p in c.get("ports", [])}
        self.dns = dict(outside)
        for service in (d for d in docs if d["kind"] == "Service"):
            self.route(service)

    @staticmethod
    def spec(doc: dict) -> dict:
        return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]

    @staticmethod
    def pod_labels(doc: dict) -> dict:
        return doc["metadata"].get("labels", {}) if doc["kind"] == "Pod" else doc["spec"]["template"]["metadata"]["labels"]

    def route(self, service: dict) -> None:
        """Cluster DNS for a Service: its names, each port, to the local
        port of the pod its selector picks (by the port's target)."""
        backends = [d for d in self.docs if d["kind"] in ("Deployment", "Pod")
                    and labels_match(service["spec"].get("selector", {}), self.pod_labels(d))]
        name = service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            for backend in backends[:1]:
                declared = {p.get("name"): p["containerPort"] for c in self.spec(backend)["containers"]
                            for p in c.get("ports", [])}
                target = declared.get(port.get("targetPort"), port.get("targetPort", port["port"]))
                local = f"127.0.0.1:{self.ports[(backend['metadata']['name'], target)]}"
                for host in (name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc",
                             f"{name}.{NAMESPACE}.svc.cluster.local"):
                    self.dns[f"{host}:{port['port']}"] = local

    def apply(self, doc: dict) -> None:
        """Creates the object; a workload's pod starts at once."""
        self.applied.append(doc)
        if doc["kind"] in ("Deployment", "Job", "Pod"):
            self.start(doc)

    def start(self, doc: dict) -> None:
        name = doc["metadata"]["name"]
        rewrites = dict(self.dns)
        for (workload, port), local in self.ports.items():
            if workload == name:
                rewrites[f"0.0.0.0:{port}"] = f"127.0.0.1:{local}"
        commands = self.manifests.commands(doc, os.path.join(self.root, name), {}, rewrites)
        self.pods[name] = {"doc": doc, "commands": commands, "restarts": 0}
        self.pods[name]["processes"] = [self.run(name, c) for c in commands]

    def run(self, workload: str, command):
        flags = PORT_FLAGS.get(os.path.basename(command.binary))
        extra = flags(lambda port: str(self.ports[(workload, port)])) if flags else []
        return self.fleet.start(command, extra)

    def healthy(self, doc: dict) -> bool:
        """Argo CD's health, and Helm's --wait for a Deployment: ready."""
        if doc["kind"] == "Deployment":
            return self.ready(doc)
        if doc["kind"] in ("Job", "Pod"):
            return self.completed(doc)
        return True

    def completed(self, doc: dict) -> bool:
        """A Job's or a hook Pod's pod ran to success (a Job's restarted on
        failure up to its backoffLimit; a failure past it is an error)."""
        pod = self.pods[doc["metadata"]["name"]]
        codes = [p.poll() for p in pod["processes"]]
        if all(code == 0 for code in codes):
            return True
        if any(code not in (None, 0) for code in codes):
            limit = doc["spec"].get("backoffLimit", 6) if doc["kind"] == "Job" else 0
            if pod["restarts"] >= limit:
                raise RuntimeError(f"{doc['kind']} {doc['metadata']['name']} failed: {self.log(pod)}")
            pod["restarts"] += 1
            pod["processes"] = [self.run(doc["metadata"]["name"], c) for c in pod["commands"]]
        return False

    def ready(self, doc: dict) -> bool:
        name = doc["metadata"]["name"]
        pod = self.pods[name]
        if any(p.poll() is not None for p in pod["processes"]):
            raise RuntimeError(f"{doc['kind']} {name}: a container exited: {self.log(pod)}")
        return all(self.probe(name, container, kind, command)
                   for container, command in zip(self.spec(doc)["containers"], pod["commands"])
                   for kind in ("startupProbe", "readinessProbe") if kind in container)

    def probe(self, workload: str, container: dict, kind: str, command) -> bool:
        """One probe, as the kubelet makes it."""
        probe = container[kind]
        declared = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if "tcpSocket" in probe:
            port = declared.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
            try:
                socket.create_connection(("127.0.0.1", self.ports[(workload, port)]), timeout=1).close()
                return True
            except OSError:
                return False
        if "httpGet" in probe:
            port = declared.get(probe["httpGet"]["port"], probe["httpGet"]["port"])
            url = f"http://127.0.0.1:{self.ports[(workload, port)]}{probe['httpGet']['path']}"
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    return 200 <= response.status < 400
            except (urllib.error.URLError, OSError):
                return False
        if "exec" in probe:
            argv = probe["exec"]["command"]
            env = {"PATH": os.environ.get("PATH", ""), **command.env}
            return subprocess.run([self.fleet.executable(argv[0]), *argv[1:]], env=env,
                                  capture_output=True, timeout=10).returncode == 0
        return True

    def log(self, pod: dict) -> str:
        return self.fleet.logs()[-3000:]

    def wait(self, what: str, docs: list[dict]) -> None:
        """Until every one of `docs` is healthy, or the timeout."""
        deadline = time.monotonic() + TIMEOUT
        waiting = docs
        while waiting:
            self.restart_failed_jobs()
            waiting = [d for d in waiting if not self.healthy(d)]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} timed out after {TIMEOUT:.0f} s, waiting for "
                                   f"{[d['kind'] + ' ' + d['metadata']['name'] for d in waiting]}")
            time.sleep(0.3)

    def restart_failed_jobs(self) -> None:
        """The Job controller, which runs whatever waits: a failed pod of
        any Job is restarted up to its backoffLimit (`helm upgrade --wait`
        waits for Deployments only, and a setup Job that failed while NATS
        restarted is still run again). A Job past its limit stays failed,
        which a wait for it reports."""
        for doc in self.docs:
            if doc["kind"] == "Job" and doc["metadata"]["name"] in self.pods:
                try:
                    self.completed(doc)
                except RuntimeError:
                    pass

    def upgrade(self, docs: list[dict], user_secrets: dict) -> list[dict]:
        """`helm upgrade`'s apply: new objects created, a workload whose pod
        template changed rolled (its pod stopped, a new one started), objects
        no longer rendered deleted (a finished Job's pod with them). Returns
        the objects to wait for."""
        key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
        before = {key(d): d for d in self.docs if not hook(d)}
        after = {key(d): d for d in docs if not hook(d)}
        self.docs = docs
        self.manifests = Manifests(docs, user_secrets)
        for d in docs:
            if d["kind"] in ("Deployment", "Job", "Pod"):
                for c in self.spec(d)["containers"]:
                    for p in c.get("ports", []):
                        self.ports.setdefault((d["metadata"]["name"], p["containerPort"]), free_port())
        for service in (d for d in docs if d["kind"] == "Service"):
            self.route(service)
        for gone in before.keys() - after.keys():
            self.stop_pod(gone[1])
        changed = []
        for k in sorted(after, key=lambda k: kind_order(after[k])):
            doc = after[k]
            if k not in before:
                self.apply(doc)
                changed.append(doc)
            elif doc["kind"] == "Deployment" and doc["spec"]["template"] != before[k]["spec"]["template"]:
                self.stop_pod(k[1])
                self.start(doc)
                changed.append(doc)
        return changed

    def stop_pod(self, name: str) -> None:
        """The kubelet stopping a pod: SIGTERM, then its grace period."""
        for process in self.pods.pop(name, {}).get("processes", []):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    process.kill()

    def run_hooks(self, phase: str) -> None:
        """Helm's hooks of `phase`, by weight, each group to its end."""
        hooks = sorted((d for d in self.docs if phase in hook(d)), key=lambda d: (weight(d), kind_order(d)))
        for w in sorted({weight(d) for d in hooks}):
            group = [d for d in hooks if weight(d) == w]
            for doc in group:
                self.apply(doc)
            self.wait(f"the {phase} hooks of weight {w}", [d for d in group if d["kind"] in ("Job", "Pod")])


def helm_install(cluster: Cluster) -> None:
    """`helm install --wait`, then `helm test`."""
    cluster.run_hooks("pre-install")
    objects = sorted((d for d in cluster.docs if not hook(d)), key=kind_order)
    for doc in objects:
        cluster.apply(doc)
    cluster.wait("helm install --wait", [d for d in objects if d["kind"] == "Deployment"])
    cluster.run_hooks("post-install")
    cluster.run_hooks("test")


def helm_upgrade(cluster: Cluster, docs: list[dict], user_secrets: dict, between=None) -> None:
    """`helm upgrade --wait` to `docs`: pre-upgrade hooks, the changes,
    `between` (what an operator does while the rollout waits, e.g. restart
    NATS), then every Deployment ready, then post-upgrade hooks."""
    current = cluster.docs
    cluster.docs = docs
    cluster.manifests = Manifests(docs, user_secrets)
    cluster.run_hooks("pre-upgrade")
    cluster.docs = current
    cluster.upgrade(docs, user_secrets)
    if between:
        between()
    cluster.wait("helm upgrade --wait", [d for d in docs if d["kind"] == "Deployment" and not hook(d)])
    cluster.run_hooks("post-upgrade")


def argo_sync(cluster: Cluster) -> None:
    """An Argo CD sync: PreSync, the waves in order, PostSync."""
    cluster.run_hooks("pre-install")
    objects = [d for d in cluster.docs if not hook(d)]
    for w in sorted({wave(d) for d in objects}):
        group = sorted((d for d in objects if wave(d) == w), key=kind_order)
        for doc in group:
            cluster.apply(doc)
        cluster.wait(f"Argo CD sync wave {w}", group)
    cluster.run_hooks("post-install")


def secret_file(docs: list[dict], suffix: str) -> str:
    manifests = Manifests(docs)
    name = next(n for n in manifests.secrets if n.endswith(suffix))
    return manifests.secrets[name]["toolfleet-users.conf"]


# The operator's own Redis user, outside the chart's users file, with which
# it loads a new pool's user into a running Redis (ACL SETUSER).
REDIS_ADMIN = "operator-not-secret"


def outside_servers(fleet: Fleet, root: str, docs: list[dict], values: dict) -> dict[str, str]:
    """NATS and Redis as an operator runs them for the release: each with
    the users file the chart rendered, over TLS when the values ask (a
    server certificate, and for Redis the clients' too where they present
    one); their addresses as the values name them."""
    nats_port, monitor_port, redis_port = free_port(), free_port(), free_port()
    nats_tls = values["nats"]["tls"]["secretName"]
    redis_tls = values.get("redis", {}).get("tls", {}).get("secretName")
    pem = lambda name: os.path.join(root, name)  # noqa: E731
    with open(os.path.join(root, "nats-users.conf"), "w") as f:
        f.write(secret_file(docs, "-nats-users"))
    conf = os.path.join(root, "nats.conf")
    with open(conf, "w") as f:
        f.write(f'listen: "127.0.0.1:{nats_port}"\nhttp: "127.0.0.1:{monitor_port}"\n'
                f'jetstream {{ store_dir: "{root}/jetstream" }}\ninclude "nats-users.conf"\n')
        if nats_tls:
            f.write(f'tls {{ cert_file: "{pem("server.crt")}", key_file: "{pem("server.key")}" }}\n')
    redis_users = os.path.join(root, "redis-users.conf")
    with open(redis_users, "w") as f:
        f.write(secret_file(docs, "-redis-users"))
    redis_conf = os.path.join(root, "redis.conf")
    with open(redis_conf, "w") as f:
        f.write(f'bind 127.0.0.1\nsave ""\ninclude {redis_users}\n'
                f"user operator on >{REDIS_ADMIN} ~* &* +@all\n")
        if redis_tls:
            client = values["redis"]["tls"]["clientCert"]
            f.write(f"port 0\ntls-port {redis_port}\ntls-cert-file {pem('server.crt')}\n"
                    f"tls-key-file {pem('server.key')}\ntls-ca-cert-file {pem('ca.crt')}\n"
                    f"tls-auth-clients {'yes' if client else 'no'}\n")
        else:
            f.write(f"port {redis_port}\n")
    fleet.start(Command("nats (outside the chart)", "nats-server", ["-c", conf], {}))
    fleet.outside = {"nats_conf": conf, "nats_users": os.path.join(root, "nats-users.conf"),
                     "nats_port": nats_port, "redis_port": redis_port}
    fleet.start(Command("redis (outside the chart)", "redis-server", [redis_conf], {}))
    for port in (nats_port, redis_port):
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    host_port = lambda url: re.sub(r"^[a-z]+://([^/]+)/?$", r"\1", url)  # noqa: E731
    return {host_port(values["nats"]["url"]): f"127.0.0.1:{nats_port}",
            host_port(values.get("redis", {}).get("url", "redis://redis-master:6379/")): f"127.0.0.1:{redis_port}"}


def redis_cli(fleet: Fleet, root: str, values: dict, *args: str) -> str:
    """A command to the Redis outside the chart, as its operator."""
    tls = ["--tls", "--cacert", os.path.join(root, "ca.crt"), "--cert", os.path.join(root, "client.crt"),
           "--key", os.path.join(root, "client.key")] if values.get("redis", {}).get("tls", {}).get("secretName") else []
    done = subprocess.run(["redis-cli", "-p", str(fleet.outside["redis_port"]), *tls, "--user", "operator",
                           "--pass", REDIS_ADMIN, "--no-auth-warning", *args],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli {args}: {done.stdout}{done.stderr}")
    return done.stdout


def console_signs_in_and_out(cluster: Cluster, root: str, values: dict) -> None:
    """The console the chart rendered, as a browser uses it: its sign-in
    form, a token of the tokens file, the jobs page with the session's
    cookie, sign-out; the session kept in Redis by the console's own user
    (refused nothing) and gone at sign-out, its cookie dead."""
    [console] = [d for d in cluster.docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-console")]
    [port] = [p["containerPort"] for p in cluster.spec(console)["containers"][0]["ports"]]
    local = cluster.ports[(console["metadata"]["name"], port)]

    def ask(method: str, path: str, cookie: str = "", form: dict | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", local, timeout=10)
        headers = {"Cookie": cookie} if cookie else {}
        body = urllib.parse.urlencode(form) if form is not None else None
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        text = response.read().decode()
        cookies = [c.split(";")[0] for c in response.headers.get_all("Set-Cookie") or []]
        connection.close()
        return response.status, response.headers.get("Location", ""), cookies, text

    def csrf(page: str) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        if found is None:
            raise RuntimeError(f"no CSRF field on the page:\n{page[:2000]}")
        return found[1]

    status, _, cookies, page = ask("GET", "/sign-in")
    status, landing, cookies, page = ask("POST", "/sign-in", "; ".join(cookies), {"csrf": csrf(page), "token": TOKEN})
    session = next((c for c in cookies if c.startswith("__Host-toolfleet-session=")), None)
    if status != 303 or session is None:
        raise RuntimeError(f"console sign-in: {status}, cookies {cookies}:\n{page[:2000]}")
    status, _, _, page = ask("GET", landing, session)
    if status != 200:
        raise RuntimeError(f"console {landing}: {status}\n{page[:2000]}")
    stored = redis_cli(cluster.fleet, root, values, "--scan", "--pattern", "tf:console:session:*").split()
    if len(stored) != 1:
        raise RuntimeError(f"the console's sessions in Redis: {stored}")
    status, _, _, _ = ask("POST", "/sign-out", session, {"csrf": csrf(page)})
    after, where, _, _ = ask("GET", "/jobs", session)
    left = redis_cli(cluster.fleet, root, values, "--scan", "--pattern", "tf:console:*").split()
    if status != 303 or after != 303 or not where.startswith("/sign-in") or left:
        raise RuntimeError(f"console sign-out: {status}; then /jobs: {after} to {where}; left in Redis: {left}")
    refused = redis_cli(cluster.fleet, root, values, "ACL", "LOG")
    if "console" in refused:
        raise RuntimeError(f"Redis refused the console: {refused}")


def finish(label: str, fleet: Fleet, root: str, failures: list[str]) -> list[str]:
    """Stops every process (toolfleet's must exit 0), prints the logs of a
    failed scenario, and removes a passed one's files."""
    failures = failures + [f"{label}: {f}" for f in fleet.stop()]
    if failures:
        print(fleet.logs())
    else:
        shutil.rmtree(root, ignore_errors=True)
    return failures


def scenario(chart, bin_dir: str, label: str, values: dict, play) -> list[str]:
    """Renders `values`, installs them as `play` does, and reports."""
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = [d for p, t in sorted(rendered.items()) if not p.endswith("NOTES.txt")
            for d in yaml.safe_load_all(t) if d]
    tokens = f'[tenants.check]\ntoken_sha256 = ["{hashlib.sha256(TOKEN.encode()).hexdigest()}"]\n'
    root = tempfile.mkdtemp(prefix="toolfleet-install-")
    pems = certificates(root)
    user_secrets = {"toolfleet-tokens": {"tokens.toml": tokens}, "toolfleet-check-token": {"token": TOKEN},
                    "nats-ca": {"ca.crt": pems["ca.crt"]},
                    "redis-client": {"ca.crt": pems["ca.crt"], "tls.crt": pems["client.crt"],
                                     "tls.key": pems["client.key"]}}
    fleet = Fleet(root, bin_dir)
    failures = []
    try:
        dev = values.get("dev", {}).get("enabled", False)
        outside = {} if dev else outside_servers(fleet, root, docs, values)
        cluster = Cluster(docs, user_secrets, fleet, root, outside)
        play(cluster)
        tests = [d for d in docs if "test" in hook(d)]
        if not tests:
            failures.append(f"{label}: no helm test pod")
        if play is argo_sync:
            cluster.run_hooks("test")
        print(f"install: {label}: Ready, and helm test passed")
        if values.get("console", {}).get("enabled"):
            console_signs_in_and_out(cluster, root, values)
            print(f"install: {label}: the console signed a person in and out, its session in Redis")
    except Exception as err:  # noqa: BLE001 - reported with the logs
        failures.append(f"{label}: {type(err).__name__}: {err}")
    return finish(label, fleet, root, failures)


def gitops_values(pools: list[dict], hashes: dict, check_token: dict) -> dict:
    """Values as a GitOps repository holds them: the credentials Secret's
    name and the passwords' hashes, nothing random."""
    return {
        "nats": {"url": "nats://nats:4222", "replicas": 1, "auth": "users",
                 "tls": {"secretName": "", "clientCert": False}},
        "credentials": {"existingSecret": "fleet-credentials", "passwordHashes": hashes},
        "orchestrator": {"config": {"api": {"allow_scripted": True}}},
        "tests": {"enabled": True, "check": "scripted", **check_token, "clientTlsSecret": "",
                  "model": {"provider": "openai-responses", "name": "m", "input": "x"}},
        "pools": pools,
    }


def upgrade_scenario(chart, bin_dir: str, check_token: dict) -> list[str]:
    """Installs with the GitOps credentials, then upgrades to one more pool
    under `helm upgrade --wait`: its users reach NATS by the restart a new
    account needs (decision 0033) and Redis by ACL SETUSER, the setup Job
    of the new render (a new name: a new tool) makes its tool's consumer,
    its Deployment becomes ready, and helm test passes again."""
    label = "a pool added by helm upgrade --wait"
    defaults = [{"name": "general", "tools": ["calculate", "get_current_weather"], "replicas": 1, "maxInFlight": 8,
                 "resources": {}, "autoscaling": {"enabled": False, "minReplicas": 1, "maxReplicas": 2,
                                                  "targetCPU": 70, "lagThreshold": 8}}]
    # A tool no pool served before: the upgrade's setup Job makes its consumer.
    maps = {**defaults[0], "name": "maps", "tools": ["trend_analysis"]}
    users = ["setup", "orchestrator", "pool-general", "pool-maps"]
    passwords = {u: f"{u}-{os.urandom(8).hex()}" for u in users}
    nats_hashes = {u: bcrypt.hashpw(passwords[u].encode(), bcrypt.gensalt(rounds=4)).decode() for u in users}
    redis_hashes = {u: hashlib.sha256(passwords[u].encode()).hexdigest() for u in users if u != "setup"}
    before = {"nats": {u: h for u, h in nats_hashes.items() if u != "pool-maps"},
              "redis": {u: h for u, h in redis_hashes.items() if u != "pool-maps"}}
    secret = {**{f"nats-{u}": p for u, p in passwords.items()},
              **{f"redis-{u}": p for u, p in passwords.items() if u != "setup"}}
    render = lambda values: [d for p, t in sorted(chart.render(values, name=RELEASE, namespace=NAMESPACE,  # noqa: E731
                                                               is_install=True).items())
                             if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]
    first = render(gitops_values(defaults, before, check_token))
    second = render(gitops_values([*defaults, maps], {"nats": nats_hashes, "redis": redis_hashes}, check_token))
    root = tempfile.mkdtemp(prefix="toolfleet-upgrade-")
    tokens = f'[tenants.check]\ntoken_sha256 = ["{hashlib.sha256(TOKEN.encode()).hexdigest()}"]\n'
    user_secrets = {"toolfleet-tokens": {"tokens.toml": tokens}, "toolfleet-check-token": {"token": TOKEN},
                    "fleet-credentials": secret}
    fleet = Fleet(root, bin_dir)
    failures = []
    try:
        outside = outside_servers(fleet, root, first, gitops_values(defaults, before, check_token))
        cluster = Cluster(first, user_secrets, fleet, root, outside)
        helm_install(cluster)

        def operator() -> None:
            """What the operator does for the new pool: the NATS servers
            restarted with the new users file, the new Redis user loaded."""
            index, (where, nats) = next((i, e) for i, e in enumerate(fleet.processes)
                                        if e[0] == "nats (outside the chart)")
            with open(fleet.outside["nats_users"], "w") as f:
                f.write(secret_file(second, "-nats-users"))
            nats.terminate()
            nats.wait(timeout=30)
            fleet.start(Command(where, "nats-server", ["-c", fleet.outside["nats_conf"]], {}))
            # In its old place, so that it still stops after the services.
            fleet.processes[index] = fleet.processes.pop()
            line = next(line for line in secret_file(second, "-redis-users").splitlines()
                        if line.startswith("user pool-maps "))
            done = subprocess.run(["redis-cli", "-p", str(fleet.outside["redis_port"]), "--user", "operator",
                                   "--pass", REDIS_ADMIN, "--no-auth-warning", "ACL", "SETUSER",
                                   *line.split()[1:]], capture_output=True, text=True, timeout=30)
            if done.stdout.strip() != "OK":
                raise RuntimeError(f"ACL SETUSER: {done.stdout}{done.stderr}")

        helm_upgrade(cluster, second, user_secrets, operator)
        jobs = {d["metadata"]["name"] for d in second if d["kind"] == "Job"} - \
            {d["metadata"]["name"] for d in first if d["kind"] == "Job"}
        if len(jobs) != 1:
            failures.append(f"{label}: the upgrade renders setup Jobs {jobs}, not one new one")
        cluster.run_hooks("test")
        print(f"install: {label}: Ready, and helm test passed")
    except Exception as err:  # noqa: BLE001 - reported with the logs
        failures.append(f"{label}: {type(err).__name__}: {err}")
    return finish(label, fleet, root, failures)


def main() -> int:
    chart_dir, bin_dir = sys.argv[1:3]
    chart = helm_python.Chart.load(chart_dir)
    with open(os.path.join(chart_dir, "values-dev.yaml")) as f:
        dev = yaml.safe_load(f)
    check_token = {"tokenSecret": {"name": "toolfleet-check-token", "key": "token"}}
    failures = []
    # The defaults, on a NATS and a Redis of one server each outside the
    # chart; scripted jobs allowed, so that helm test runs one through the
    # queues (the shipped check, model-free, is pods.py's).
    # The console on, as a browser uses it (a token of the tokens file).
    console = {"console": {"enabled": True, "replicas": 1}}
    failures += scenario(chart, bin_dir, "the defaults with helm install --wait", {
        "nats": {"url": "nats://nats:4222", "replicas": 1, "auth": "users",
                 "tls": {"secretName": "", "clientCert": False}},
        **console,
        "orchestrator": {"config": {"api": {"allow_scripted": True}}},
        "tests": {"enabled": True, "check": "scripted", **check_token, "clientTlsSecret": "",
                  "model": {"provider": "openai-responses", "name": "m", "input": "x"}},
    }, helm_install)
    # NATS and Redis outside the chart over TLS (Redis verifying the
    # services' client certificate), under --wait.
    failures += scenario(chart, bin_dir, "NATS and Redis over TLS with helm install --wait", {
        "nats": {"url": "tls://nats.messaging.svc:4222", "replicas": 1, "auth": "users",
                 "tls": {"secretName": "nats-ca", "clientCert": False}},
        "redis": {"url": "rediss://redis.cache.svc:6380/", "auth": "users",
                  "tls": {"secretName": "redis-client", "clientCert": True}},
        **console,
        "orchestrator": {"config": {"api": {"allow_scripted": True}}},
        "tests": {"enabled": True, "check": "scripted", **check_token, "clientTlsSecret": "",
                  "model": {"provider": "openai-responses", "name": "m", "input": "x"}},
    }, helm_install)
    failures += upgrade_scenario(chart, bin_dir, check_token)
    failures += scenario(chart, bin_dir, "the dev values with an Argo CD sync", dev, argo_sync)
    failures += scenario(chart, bin_dir, "the dev values with helm install --wait", dev, helm_install)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
