"""Runs what the Helm chart renders, as local processes, and jobs through it.

1. Renders deploy/helm/toolfleet with its dev values (the chart's own NATS
   and Redis), KEDA on, tokens auth and three pools: two autoscaled from
   zero by KEDA, and a knowledge-graph pool whose graph is on a volume.
2. Starts every rendered Deployment's containers as processes with the
   files and environment the kubelet would give them (kube.py): NATS with
   the rendered nats.conf and the users generated from the pools, Redis
   with the rendered ACL users, the setup Job, the orchestrator, the
   workers. Cluster DNS is played by rewriting each rendered Service's
   address to the local port of the process behind it; every listen port
   becomes a free loopback port.
3. Stops the autoscaled pools' workers, as KEDA scales an idle pool to
   zero, submits jobs whose calls wait for them, and evaluates each rendered ScaledObject's trigger as KEDA's
   nats-jetstream scaler does, against the live `/jsz`: the account,
   stream and consumer it names must exist, and the lag it reads
   (num_pending + num_ack_pending) must equal the calls waiting, as must
   the orchestrator's toolfleet_tool_calls_waiting gauge.
4. Starts a worker of each of those pools again, as KEDA does when scaling
   from zero: every job must succeed, and every process must stop cleanly.

Usage: pods.py CHART_DIR BIN_DIR
"""

import copy
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import helm_python
import yaml

from kube import Command, Manifests

TOKEN = "tok-chart-pods-7f3a"
JOBS = 3
# Each job's one round: which calls it makes.
ROUND = [
    {"name": "calculate", "arguments": {"expression": "6*7"}},
    {"name": "get_current_weather", "arguments": {"location": "Boston, MA", "unit": "celsius"}},
    {"name": "get_current_weather", "arguments": {"location": "London, UK", "unit": "celsius"}},
    {"name": "factual_qa", "arguments": {"entity": "AMD", "start_date_range": "2016-01-01",
                                          "end_date_range": "2020-12-31", "predicate": "LAUNCHED"}},
]
SCRIPT = json.dumps([{"tool_calls": ROUND}, {"message": "answer {{call_0_0.data.result}}, {{call_0_2.data.location}}"}])
# The calls each autoscaled pool's tools have waiting while it has no worker.
WAITING = {"tool_calculate": JOBS, "tool_get_current_weather": 2 * JOBS}


def autoscaled(name: str, tools: list[str]) -> dict:
    return {"name": name, "tools": tools, "replicas": 1, "maxInFlight": 8, "resources": {},
            "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 4, "targetCPU": 70,
                            "lagThreshold": 4}}


def values(chart_dir: str) -> dict:
    with open(os.path.join(chart_dir, "values-dev.yaml")) as f:
        dev = yaml.safe_load(f)
    knowledge = next(p for p in dev["pools"] if p["name"] == "knowledge")
    knowledge["graph"] = {"file": "graph.jsonl",
                          "volume": {"persistentVolumeClaim": {"claimName": "knowledge-graph", "readOnly": True}}}
    return {
        **dev,
        "keda": {"enabled": True},
        "orchestrator": {**dev["orchestrator"], "auth": "tokens", "tokensSecret": "toolfleet-tokens",
                         "config": {"api": {"allow_scripted": True}}},
        # `helm test` with a token of the tokens file (the dev values run a
        # scripted job).
        "tests": {**dev["tests"], "tokenSecret": {"name": "toolfleet-check-token", "key": "token"}},
        "pools": [autoscaled("math", ["calculate"]), autoscaled("weather", ["get_current_weather"]), knowledge],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


class Fleet:
    """The processes started so far; stops them all at the end."""

    def __init__(self, root: str, bin_dir: str):
        self.root = root
        self.bin_dir = bin_dir
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.nats_server = os.environ.get("TOOLFLEET_NATS_SERVER") or os.path.join(os.path.dirname(sys.executable), "nats-server")

    def executable(self, name: str) -> str:
        # A path in the image is the binary of that name here.
        name = os.path.basename(name)
        if name in ("toolfleet-orchestrator", "toolfleet-worker", "toolfleet"):
            return os.path.join(self.bin_dir, name)
        if name == "nats-server":
            return self.nats_server
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"{name} is not installed")
        return found

    def start(self, command: Command, extra: list[str] = ()) -> subprocess.Popen:
        log = open(os.path.join(self.root, f"{len(self.processes)}-{os.path.basename(command.binary)}.log"), "w")
        env = {"PATH": os.environ.get("PATH", ""), **command.env}
        process = subprocess.Popen([self.executable(command.binary), *command.args, *extra], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((command.where, process))
        return process

    def run(self, command: Command) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", ""), **command.env}
        return subprocess.run([self.executable(command.binary), *command.args], env=env,
                              capture_output=True, text=True, timeout=120)

    def stop(self) -> list[str]:
        """Stops every process (SIGTERM, as the kubelet does); the
        toolfleet ones must exit 0."""
        problems = []
        for where, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                code = "killed"
            if "toolfleet" in where and code != 0:
                problems.append(f"{where} stopped with {code}")
        return problems

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith(".log"):
                with open(os.path.join(self.root, name)) as f:
                    out.append(f"--- {name}\n{f.read()[-3000:]}")
        return "\n".join(out)


# The namespace the chart is rendered into, and the one KEDA runs in.
NAMESPACE = "toolfleet"
KEDA_NAMESPACE = "keda"


def resolver(endpoints: dict[str, str], namespace: str):
    """Cluster DNS as a pod in `namespace` sees it: `host:port` of a
    Service of the release (`endpoints`, by short name) resolves to its
    local address only by a name the pod's search path completes to the
    Service's full name (`<ns>.svc.cluster.local`, `svc.cluster.local`,
    `cluster.local`): a short name only from the Service's own namespace."""
    full = {f"{service.split(':')[0]}.{NAMESPACE}.svc.cluster.local:{service.split(':')[1]}": local
            for service, local in endpoints.items()}
    search = ("", f".{namespace}.svc.cluster.local", ".svc.cluster.local", ".cluster.local")

    def resolve(host_port: str) -> str | None:
        host, _, port = host_port.rpartition(":")
        return next((full[f"{host}{suffix}:{port}"] for suffix in search if f"{host}{suffix}:{port}" in full), None)

    return resolve


def keda_lag(trigger: dict, resolve) -> int:
    """What KEDA's nats-jetstream scaler reads for `trigger`: it asks
    `/jsz?acc=<account>&consumers=true&config=true` on the monitoring
    endpoint, finds the account, the stream and the consumer, and takes
    num_pending + num_ack_pending. Unlike KEDA (which falls back to the
    stream's last sequence), a name that is not there is an error."""
    meta = trigger["metadata"]
    endpoint = resolve(meta["natsServerMonitoringEndpoint"])
    if endpoint is None:
        raise LookupError(f"{meta['natsServerMonitoringEndpoint']} does not resolve to a rendered Service "
                          f"from KEDA's namespace {KEDA_NAMESPACE}")
    url = f"http://{endpoint}/jsz?acc={meta['account']}&consumers=true&config=true"
    with urllib.request.urlopen(url, timeout=5) as response:
        jsz = json.load(response)
    for account in jsz.get("account_details") or []:
        if account["name"] != meta["account"]:
            continue
        for stream in account.get("stream_detail") or []:
            if stream["name"] != meta["stream"]:
                continue
            for consumer in stream.get("consumer_detail") or []:
                if consumer["name"] == meta["consumer"]:
                    return consumer["num_pending"] + consumer["num_ack_pending"]
            raise LookupError(f"stream {meta['stream']} has no consumer {meta['consumer']}")
        raise LookupError(f"account {meta['account']} has no stream {meta['stream']}")
    raise LookupError(f"/jsz has no account {meta['account']}")


def main() -> int:
    chart_dir, bin_dir = sys.argv[1:3]
    chart = helm_python.Chart.load(chart_dir)
    rendered = chart.render(values(chart_dir), name="tf", namespace=NAMESPACE, is_install=True)
    docs = [d for path, text in sorted(rendered.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    tokens = f'[tenants.pods]\ntoken_sha256 = ["{hashlib.sha256(TOKEN.encode()).hexdigest()}"]\n'
    user_secrets = {"toolfleet-tokens": {"tokens.toml": tokens}, "toolfleet-check-token": {"token": TOKEN}}
    manifests = Manifests(docs, user_secrets)
    # The same release with `helm test`'s model-free check, for its pod only.
    tools_check = chart.render({**values(chart_dir), "tests": {**values(chart_dir)["tests"], "check": "tools"}},
                               name="tf", namespace=NAMESPACE, is_install=True)
    [tools_pod] = [d for d in yaml.safe_load_all(tools_check["toolfleet/templates/tests/check.yaml"]) if d]
    by_component = {}
    for doc in manifests.workloads():
        labels = doc["metadata"]["labels"]
        by_component.setdefault(labels.get("toolfleet.dev/pool") or labels["app.kubernetes.io/component"], doc)

    # Cluster DNS: each rendered Service's address -> the local port of its process.
    ports = {"nats": free_port(), "monitoring": free_port(), "redis": free_port(), "grpc": free_port()}
    endpoints = {"tf-toolfleet-nats:4222": f"127.0.0.1:{ports['nats']}",
                 "tf-toolfleet-nats:8222": f"127.0.0.1:{ports['monitoring']}",
                 "tf-toolfleet-redis:6379": f"127.0.0.1:{ports['redis']}",
                 "tf-toolfleet-orchestrator:50051": f"127.0.0.1:{ports['grpc']}"}
    services = {f"{d['metadata']['name']}:{p['port']}" for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]}
    from_keda = resolver(endpoints, KEDA_NAMESPACE)
    # A pod of the release reaches a Service by its short name or its full
    # one: both become the local address.
    cluster_dns = dict(endpoints)
    for service, local in endpoints.items():
        name, port = service.split(":")
        for suffix in (f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local"):
            cluster_dns[f"{name}{suffix}:{port}"] = local
    if not set(endpoints) <= services:
        print(f"FAIL the rendered Services are {sorted(services)}")
        return 1

    root = tempfile.mkdtemp(prefix="toolfleet-pods-")
    graph = os.path.join(root, "graph-volume")
    os.makedirs(graph)
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "worker/data/kg/sample-graph.jsonl"), os.path.join(graph, "graph.jsonl"))
    fleet = Fleet(root, bin_dir)

    def commands(component: str, listen: dict[str, int] | None = None) -> list[Command]:
        rewrites = dict(cluster_dns)
        for address, port in (listen or {}).items():
            rewrites[address] = f"127.0.0.1:{port}"
        return manifests.commands(by_component[component], os.path.join(root, component),
                                  {"graph": graph}, rewrites)

    def probe(component: str, name: str) -> bool:
        """One HTTP probe of the container, as the kubelet makes it: a GET
        of its path on the port it names (by name or number), here the
        local port standing for that container port; 2xx and 3xx pass."""
        [container] = by_component[component]["spec"]["template"]["spec"]["containers"]
        http = container[name]["httpGet"]
        declared = {p.get("name"): p["containerPort"] for p in container["ports"]}
        port = declared.get(http["port"], http["port"])
        local = {9090: metrics_ports[component], 50051: ports["grpc"]}[port]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}{http['path']}", timeout=1) as response:
                return 200 <= response.status < 400
        except urllib.error.HTTPError as err:
            return 200 <= err.code < 400

    metrics_ports = {}

    def service(component: str) -> subprocess.Popen:
        metrics_ports[component] = free_port()
        [command] = commands(component, {"0.0.0.0:50051": ports["grpc"], "0.0.0.0:9090": metrics_ports[component]})
        process = fleet.start(command)
        # The kubelet's order: the startup probe, then readiness (and
        # liveness, which must pass as well).
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            wait_until(f"{command.where} to pass its {name}", lambda: probe(component, name), 60)
        return process

    def calls_waiting() -> dict[str, int]:
        """The orchestrator's toolfleet_tool_calls_waiting, by consumer."""
        url = f"http://127.0.0.1:{metrics_ports['orchestrator']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return {f"tool_{m[1]}": int(float(m[2]))
                for m in re.finditer(r'^toolfleet_tool_calls_waiting\{tool="([^"]+)"\} (\S+)$', text, re.M)
                if f"tool_{m[1]}" in WAITING}

    def toolfleet(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([fleet.executable("toolfleet"), *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TOOLFLEET_ADDR": f"http://127.0.0.1:{ports['grpc']}",
                                   "TOOLFLEET_TOKEN": TOKEN})

    failures = []
    try:
        [nats] = commands("nats")
        fleet.start(nats, ["-a", "127.0.0.1", "-p", str(ports["nats"]), "-m", str(ports["monitoring"])])
        [redis] = commands("redis")
        fleet.start(redis, ["--port", str(ports["redis"]), "--bind", "127.0.0.1"])
        wait_until("NATS", lambda: urllib.request.urlopen(f"http://127.0.0.1:{ports['monitoring']}/healthz").status == 200)
        wait_until("Redis", lambda: socket.create_connection(("127.0.0.1", ports["redis"])).close() is None)

        [setup] = commands("setup")
        done = fleet.run(setup)
        if done.returncode != 0:
            raise RuntimeError(f"the setup Job failed:\n{done.stdout}{done.stderr}")
        service("orchestrator")
        service("knowledge")
        # Each autoscaled pool starts at one worker, then KEDA scales it to
        # zero: SIGTERM, as the kubelet stops a pod.
        for pool in ("math", "weather"):
            worker = service(pool)
            worker.send_signal(signal.SIGTERM)
            if worker.wait(timeout=40) != 0:
                raise RuntimeError(f"the {pool} worker stopped with {worker.returncode}")

        jobs = []
        for n in range(JOBS):
            done = toolfleet("submit", "--provider", "scripted", "--script", SCRIPT, f"job {n}")
            if done.returncode != 0:
                raise RuntimeError(f"submit failed:\n{done.stdout}{done.stderr}")
            jobs.append(done.stdout.strip().split()[-1])

        # KEDA's view, with the autoscaled pools at zero.
        triggers = [t for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
        if sorted(t["metadata"]["consumer"] for t in triggers) != sorted(WAITING):
            failures.append(f"the ScaledObjects watch {[t['metadata']['consumer'] for t in triggers]}")

        def lags() -> dict[str, int]:
            return {t["metadata"]["consumer"]: keda_lag(t, from_keda) for t in triggers}

        try:
            wait_until("the calls to wait", lambda: lags() == WAITING)
            time.sleep(1)
            seen = lags()
            if seen != WAITING:
                failures.append(f"KEDA would read lags {seen}, the calls waiting are {WAITING}")
            print(f"pods: KEDA reads the lags {seen} with the autoscaled pools at zero")
            # With no worker, nothing is delivered: the orchestrators' gauge
            # (num_pending) shows the same calls.
            wait_until("the orchestrator's gauge", lambda: calls_waiting() == WAITING)
        except (RuntimeError, LookupError) as err:
            failures.append(f"KEDA's view: {err}; it reads {lags() if not isinstance(err, LookupError) else '-'}")
        # A name KEDA would not find must not pass unnoticed.
        for key, typo in (("consumer", "tool_calculat"), ("stream", "TOOLFLEET_CALL"), ("account", "toolflet")):
            wrong = copy.deepcopy(triggers[0])
            wrong["metadata"][key] = typo
            try:
                keda_lag(wrong, from_keda)
                failures.append(f"a trigger naming {key} {typo} found a lag")
            except LookupError:
                pass

        # KEDA scales the pools up from zero.
        service("math")
        service("weather")
        for job in jobs:
            done = toolfleet("watch", job)
            got = toolfleet("get", "--json", job)
            output = json.loads(got.stdout).get("output_text", "") if got.returncode == 0 else ""
            if done.returncode != 0 or output != "answer 42, London, UK":
                failures.append(f"job {job}: watch exited {done.returncode}, output {output!r}:\n{done.stdout[-2000:]}")
        print(f"pods: {len(jobs)} jobs succeeded through {len(fleet.processes)} rendered containers")
        # `helm test`: its hook pods, run as the kubelet would once Helm
        # creates them, must succeed.
        hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
        if [d["kind"] for d in hooks] != ["Pod"]:
            failures.append(f"helm test runs {[d['kind'] for d in hooks]}")
        for label, pod in (("scripted", hooks[0]), ("tools", tools_pod)):
            [check] = Manifests([pod], user_secrets).commands(pod, os.path.join(root, f"test-{label}"),
                                                              rewrites=cluster_dns)
            done = fleet.run(check)
            if done.returncode != 0:
                failures.append(f"helm test ({label}) exited {done.returncode}:\n{done.stdout}{done.stderr}")
        print("pods: helm test passed, a scripted job and every pool's tools served")
    except Exception as err:  # noqa: BLE001 - reported with the processes' logs
        failures.append(f"{type(err).__name__}: {err}")
    failures.extend(fleet.stop())
    if failures:
        print(fleet.logs())
    else:
        shutil.rmtree(root, ignore_errors=True)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
