"""Checks the Helm chart deploy/helm/toolfleet without a cluster or a helm
binary, through the Helm v4 SDK (helm-python-sdk):

- `helm lint --strict` finds no error and no warning;
- it renders with its default values and with other value sets, and every
  manifest validates (kubernetes-validate, strict) against a current
  Kubernetes;
- values the schema forbids fail the render;
- every container of every rendered Deployment and Job runs in the
  workspace's own binary, with the files and environment the kubelet would
  give it (kube.py): the setup Job for real against the test NATS server,
  the services' configurations load (`--print-config`) with every file they
  name mounted, the workers serve exactly their pool's tools and the setup
  creates consumers for exactly those, and every probe is a subcommand of
  the container's binary;
- `toolfleet-orchestrator credentials --pool` prints what adds a pool to a
  release whose passwords GitOps keeps, and the chart carries its hashes;
- the NATS users and Redis ACL users it generates for the default pools are
  deploy/nats and deploy/redis's files (which tests/tests/permissions.rs
  loads into real servers), and adding a pool adds exactly its user with
  exactly its tools' permissions.

Usage: chart.py CHART_DIR BIN_DIR NATS_URL
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

import bcrypt
import helm_python
import kubernetes_validate
import yaml

from common import Checks, certificates, listen_ports, run
from kube import Manifests, Unresolved

KUBERNETES = kubernetes_validate.latest_version()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def pool(name: str, tools: list[str], replicas: int = 1, autoscaled: bool = False, low: int = 1, **extra) -> dict:
    return {
        "name": name, "tools": tools, "replicas": replicas, "maxInFlight": 16, "resources": {},
        "autoscaling": {"enabled": autoscaled, "minReplicas": low, "maxReplicas": 8, "targetCPU": 70, "lagThreshold": 16},
        **extra,
    }


GENERAL = ["calculate", "get_current_weather"]
KNOWLEDGE = ["factual_qa", "trend_analysis"]

# What a platform team sets (the global `pod`, a role's own, the image's
# registry and digests), checked by check_platform.
DIGEST = "sha256:" + "ab" * 32
PLATFORM = {
    "image": {"registry": "registry.example.com/ai", "orchestrator": "toolfleet-orchestrator",
              "worker": "toolfleet-worker", "tag": "0.1.0", "digests": {"orchestrator": DIGEST, "worker": ""},
              "pullPolicy": "IfNotPresent", "pullSecrets": ["registry-login"]},
    "pod": {
        "annotations": {"example.com/team": "agents"}, "labels": {"cost-center": "ai"},
        "nodeSelector": {"pool": "general"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                             "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "toolfleet"}}}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "toolfleet"}}}],
        "priorityClassName": "agents-high",
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
        "extraVolumes": [{"name": "corporate-ca", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        "securityContext": {}, "containerSecurityContext": {"allowPrivilegeEscalation": False},
    },
    "orchestrator": {"pod": {"nodeSelector": {"pool": "control"}}, "preStopSeconds": 7},
    # The console takes the global pod settings too.
    "console": {"enabled": True},
}


def check_platform(docs: list[dict]) -> list[str]:
    """PLATFORM's settings reach every pod, a role's key replaces the
    global one, images carry the registry and a pinned digest wins."""
    failures = []
    for doc in (d for d in docs if d["kind"] in ("Deployment", "Job")):
        name = doc["metadata"]["name"]
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") in ("nats", "redis"):
            continue
        template = doc["spec"]["template"]
        spec = template["spec"]
        orchestrator = name.endswith("-orchestrator")
        want = {
            "nodeSelector": {"pool": "control" if orchestrator else "general"},
            "tolerations": PLATFORM["pod"]["tolerations"], "affinity": PLATFORM["pod"]["affinity"],
            "topologySpreadConstraints": PLATFORM["pod"]["topologySpreadConstraints"],
            "priorityClassName": "agents-high", "imagePullSecrets": [{"name": "registry-login"}],
            "securityContext": {},
        }
        for key, value in want.items():
            if spec.get(key) != value:
                failures.append(f"{name}: {key} is {spec.get(key)!r}, not {value!r}")
        if template["metadata"]["labels"].get("cost-center") != "ai" or \
                template["metadata"].get("annotations", {}).get("example.com/team") != "agents":
            failures.append(f"{name}: pod labels or annotations missing: {template['metadata']}")
        container = spec["containers"][0]
        worker = "worker" in container["image"]
        image = "registry.example.com/ai/" + ("toolfleet-worker:0.1.0" if worker else f"toolfleet-orchestrator@{DIGEST}")
        if container["image"] != image:
            failures.append(f"{name}: image {container['image']}, not {image}")
        if {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"} not in container["env"]:
            failures.append(f"{name}: no extra env")
        if not any(m["name"] == "corporate-ca" for m in container.get("volumeMounts", [])) or \
                not any(v["name"] == "corporate-ca" for v in spec.get("volumes", [])):
            failures.append(f"{name}: no extra volume")
        if container["securityContext"] != {"allowPrivilegeEscalation": False}:
            failures.append(f"{name}: container securityContext {container['securityContext']}")
        if orchestrator:
            pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
            grace = spec["terminationGracePeriodSeconds"]
            if pre_stop != 7 or grace != 7 + 20 + 10:
                failures.append(f"{name}: preStop {pre_stop}, grace {grace}")
    return failures


# Value sets beside the defaults; each must render and validate.
# Seeds of a NATS cluster and of a Redis Cluster, as a user lists them.
# An issuer of JWTs with its claim mapping (orchestrator.identity), as the
# services print it back with the keys it does not set.
KEYCLOAK = {
    "issuer": "https://keycloak.example.com/realms/acme",
    "audiences": ["toolfleet"],
    "tenant_claim": "tenant",
    "person_claim": "preferred_username",
    "role_claims": ["realm_access.roles"],
    "roles": {"toolfleet-agents": ["agent"], "toolfleet-approvers": ["approver", "reader"]},
}
ISSUER_DEFAULTS = {"jwks_url": None, "algorithms": ["RS256", "ES256"], "tenant": None, "tenants": []}

CLUSTER_NATS = "nats://nats-0.nats:4222,nats://nats-1.nats:4222,nats://nats-2.nats:4222"
CLUSTER_REDIS = "redis://redis-0.redis:6379,redis://redis-1.redis:6379,redis://redis-2.redis:6379"

VALUE_SETS = {
    "defaults": None,
    "a NATS cluster and a Redis Cluster": {
        "nats": {"url": CLUSTER_NATS, "replicas": 3},
        "redis": {"url": CLUSTER_REDIS, "cluster": True, "waitReplicas": 1},
    },
    "one pool, external NATS and Redis over TLS, no auth, other ports": {
        "nats": {"url": "tls://nats.messaging.svc:4222", "auth": "none",
                 "tls": {"secretName": "nats-ca", "clientCert": False}},
        "redis": {"url": "rediss://redis.cache.svc:6380/", "auth": "none",
                  "tls": {"secretName": "redis-client", "clientCert": True}},
        # Ports an image's environment must not override.
        "orchestrator": {"auth": "none", "grpcPort": 8443, "metricsPort": 9464},
        "worker": {"metricsPort": 9465},
        "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318",
                      "otlpProtocol": "http/protobuf", "sampleRatio": 0.05},
        "pools": [pool("everything", GENERAL + KNOWLEDGE, replicas=3)],
        # Its Redis over TLS with a client certificate, no Redis user.
        "console": {"enabled": True, "port": 8081},
    },
    "without network policies, every pool autoscaled": {
        "networkPolicy": {"enabled": False, "grpcFrom": [], "metricsFrom": [], "egressPorts": [4222]},
        "pools": [pool("math", ["calculate"], autoscaled=True), pool("weather", ["get_current_weather"], autoscaled=True)],
    },
    "no service account of its own": {
        "serviceAccount": {"create": False, "name": "tool-runner"},
    },
    "KEDA, every pool scaling to zero": {
        "keda": {"enabled": True, "natsMonitoring": {"service": "nats-headless", "namespace": "messaging", "port": 8222},
                 "account": "$G", "fallback": {"failureThreshold": 3, "replicas": 2}},
        "pools": [pool("general", GENERAL, autoscaled=True, low=0), pool("knowledge", KNOWLEDGE, autoscaled=True, low=0)],
    },
    "the setup as a Helm hook, own credentials": {
        "setup": {"useHelmHooks": True, "hookDeadlineSeconds": 240},
        "credentials": {"existingSecret": "fleet-passwords", "passwordHashes": {"nats": {}, "redis": {}}},
    },
    "platform settings: a registry and digests, scheduling, extra env and volumes, OpenShift": PLATFORM,
    # The template of a worker of your own (examples/custom-worker) as a
    # pool's image: it must load the pool's configuration and serve its tool.
    "a pool of a worker of your own": {
        "pools": [pool("general", GENERAL), pool("orders", ["order_status"], image="registry.example.com/orders-worker:1.0")],
    },
    "dev: the chart's own NATS and Redis": "values-dev.yaml",
    "dev, a release name of 53 characters": "values-dev.yaml",
    "observability, gRPC mutual TLS, an OpenAI key, a graph volume, own credentials": {
        "credentials": {"existingSecret": "fleet-passwords", "passwordHashes": {"nats": {}, "redis": {}}},
        "openai": {"secretName": "openai", "secretKey": "api-key"},
        "orchestrator": {
            "tls": {"secretName": "toolfleet-grpc-tls", "verifyClients": True},
            "config": {"api": {"default_model": {"provider": "openai-responses", "name": "gpt-4.1-mini"},
                               "max_calls_per_turn": 16}},
            "identity": {"issuers": [KEYCLOAK], "clock_skew": "30s"},
        },
        "pools": [
            pool("general", GENERAL, config={"runtime": {"max_deliveries": 7}}),
            pool("knowledge", KNOWLEDGE, graph={
                "file": "graphs/companies.jsonl",
                "volume": {"persistentVolumeClaim": {"claimName": "knowledge-graph", "readOnly": True}},
            }),
        ],
        # Through the orchestrators' mutual TLS, with sign-in at a provider.
        "console": {"enabled": True, "clientTlsSecret": "console-client-tls", "sessionTtl": "1h 30m",
                    "traceUrl": "https://jaeger.example.com/trace/{trace_id}",
                    "oidc": {"issuer": KEYCLOAK["issuer"], "clientId": "toolfleet-console",
                             "clientSecret": {"name": "console-oidc", "key": "secret"},
                             "redirectUrl": "https://console.example.com/oidc/callback",
                             "resource": "https://toolfleet.example.com", "scopes": "openid roles"}},
        "observability": {
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
            "grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"}},
        },
    },
}

# The release name of a value set, when not "tf": Helm's longest.
RELEASE_NAMES = {"dev, a release name of 53 characters": "a-release-name-as-long-as-helm-allows-fifty-three-chr"}

# What each value set must render, by kind.
KINDS = {
    "defaults": {"Deployment": 3, "Service": 2, "PodDisruptionBudget": 3, "Job": 1, "ServiceAccount": 1,
                 "NetworkPolicy": 2, "HorizontalPodAutoscaler": 1, "ConfigMap": 1, "Secret": 3},
    "one pool, external NATS and Redis over TLS, no auth, other ports": {"Deployment": 3, "NetworkPolicy": 3,
                                                            "HorizontalPodAutoscaler": 0, "ConfigMap": 1,
                                                            "Secret": 0},
    "without network policies, every pool autoscaled": {"Deployment": 3, "NetworkPolicy": 0,
                                                        "HorizontalPodAutoscaler": 2},
    "no service account of its own": {"ServiceAccount": 0, "Deployment": 3},
    "a pool of a worker of your own": {"Deployment": 3, "PodDisruptionBudget": 3},
    "a NATS cluster and a Redis Cluster": {"Deployment": 3, "Job": 1},
    "KEDA, every pool scaling to zero": {"Deployment": 3, "ScaledObject": 2, "HorizontalPodAutoscaler": 0},
    "dev: the chart's own NATS and Redis": {"Deployment": 5, "Service": 4, "ConfigMap": 3, "Secret": 3},
    "platform settings: a registry and digests, scheduling, extra env and volumes, OpenShift": {"Deployment": 4,
                                                                                              "Service": 3,
                                                                                              "NetworkPolicy": 3},
    "dev, a release name of 53 characters": {"Deployment": 5, "Service": 4, "ConfigMap": 3, "Secret": 3},
    "the setup as a Helm hook, own credentials": {"Job": 1, "ConfigMap": 2, "Secret": 1},
    "observability, gRPC mutual TLS, an OpenAI key, a graph volume, own credentials": {
        "ServiceMonitor": 1, "PrometheusRule": 1, "ConfigMap": 2, "Secret": 1, "Deployment": 4,
        "PodDisruptionBudget": 4},
}

# What the services of a value set must have in their configuration
# (`--print-config`), by the Deployment's component or pool.
CONFIGURED = {
    "defaults": {role: {"nats.replicas": 3, "redis.cluster": False, "redis.wait_replicas": 0}
                 for role in ("orchestrator", "general")},
    "a NATS cluster and a Redis Cluster": {
        role: {"nats.replicas": 3, "nats.url": CLUSTER_NATS, "redis.cluster": True, "redis.url": CLUSTER_REDIS,
               "redis.wait_replicas": 1}
        for role in ("orchestrator", "general", "knowledge")},
    "dev: the chart's own NATS and Redis": {
        role: {"nats.replicas": 1, "redis.cluster": False} for role in ("orchestrator", "general")},
    "observability, gRPC mutual TLS, an OpenAI key, a graph volume, own credentials": {
        "orchestrator": {"api.default_model.name": "gpt-4.1-mini", "api.max_calls_per_turn": 16,
                         "api.identity.issuers": [dict(ISSUER_DEFAULTS, **KEYCLOAK)],
                         "api.identity.clock_skew": "30s",
                         "nats.user": "orchestrator", "redis.user": "orchestrator",
                         # A file, so that a rotated key is used without a restart.
                         "openai.api_key_file": "/etc/toolfleet/openai/api-key"},
        "general": {"runtime.max_deliveries": 7, "runtime.max_in_flight": 16, "nats.user": "pool-general",
                    "nats.inbox_prefix": "_INBOX.pool-general", "pool": "general"},
        "knowledge": {"runtime.max_deliveries": 5, "pool": "knowledge"},
    },
    "a pool of a worker of your own": {
        "orders": {"tools": ["order_status"], "nats.user": "pool-orders", "redis.user": "pool-orders", "pool": "orders"},
    },
    "one pool, external NATS and Redis over TLS, no auth, other ports": {
        "orchestrator": {"nats.user": None, "redis.user": None, "api.auth": "none",
                         "redis.tls.cert_file": "/etc/toolfleet/redis-tls/tls.crt", "nats.tls.cert_file": None},
        "everything": {"nats.tls.ca_file": "/etc/toolfleet/nats-tls/ca.crt"},
    },
}

def user_secrets() -> dict[str, dict[str, str]]:
    """Secrets the user creates beside the chart (NOTES.txt, docs/deploy.md),
    their certificates real ones: the services read them before they
    connect (and for --print-config), as they will in a pod."""
    with tempfile.TemporaryDirectory() as root:
        pems = certificates(root)
    return {
        "toolfleet-tokens": {"tokens.toml": '[tenants.team]\ntoken_sha256 = ["' + "0" * 64 + '"]\n'},
        "toolfleet-grpc-tls": {"tls.crt": pems["server.crt"], "tls.key": pems["server.key"], "ca.crt": pems["ca.crt"]},
        "openai": {"api-key": "sk-test"},
        "nats-ca": {"ca.crt": pems["ca.crt"]},
        "redis-client": {"ca.crt": pems["ca.crt"], "tls.crt": pems["client.crt"], "tls.key": pems["client.key"]},
        **{name: {f"{kind}-{user}": "pw" for kind in ("nats", "redis")
                  for user in ("setup", "orchestrator", "pool-general", "pool-knowledge", "console")}
           for name in ("fleet-passwords", "toolfleet-credentials")},
        "console-client-tls": {"tls.crt": pems["client.crt"], "tls.key": pems["client.key"]},
        "console-oidc": {"secret": "console-client-secret"},
    }


USER_SECRETS = user_secrets()

# Kinds that are CRDs, validated against their CRD's schema (crds.mjs).
CUSTOM = {"keda.sh/v1alpha1", "monitoring.coreos.com/v1"}

# Values the schema must refuse, and why.
REFUSED = {
    "a tool name that is not one": {"pools": [{"name": "p", "tools": ["bad tool!"], "replicas": 1, "maxInFlight": 1, "resources": {},
                                               "autoscaling": {"enabled": False, "minReplicas": 1, "maxReplicas": 1, "targetCPU": 70, "lagThreshold": 10}}]},
    "scale to zero without KEDA": {"pools": [{"name": "p", "tools": ["calculate"], "replicas": 1, "maxInFlight": 1, "resources": {},
                                              "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "targetCPU": 70, "lagThreshold": 10}}]},
    "a sampling ratio over 1": {"telemetry": {"otlpEndpoint": "http://c:4317", "otlpProtocol": "grpc", "sampleRatio": 2}},
    "a CPU target over 100%": {"pools": [{"name": "p", "tools": ["calculate"], "replicas": 1, "maxInFlight": 1, "resources": {},
                                          "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetCPU": 150, "lagThreshold": 10}}]},
    "an unknown key": {"orchestrator": {"replica": 2}},
    "six copies of a stream": {"nats": {"replicas": 6}},
    "a Redis seed list with another scheme": {"redis": {"url": "redis://a:6379,http://b:6379"}},
    "a seed list with a blank": {"nats": {"url": "nats://a:4222, nats://b:4222"}},
    "no pool": {"pools": []},
    "a rollout that can neither surge nor stop a pod": {"worker": {"drainSeconds": 20, "metricsPort": 9090, "rollout": {
        "maxSurge": 0, "maxUnavailable": "0%", "minReadySeconds": 10}}},
    "a rollout key the chart does not know": {"orchestrator": {"rollout": {
        "maxSurge": 1, "maxUnavailable": 0, "minReadySeconds": 10, "partition": 1}}},
    "a pool image that is not an image reference": {"pools": [pool("p", ["calculate"], image="orders worker")]},
    "a plain-text Redis URL scheme typo": {"redis": {"url": "redis:/oops"}},
    "a negative count of Redis replicas to wait for": {"redis": {"waitReplicas": -1}},
    "tokens without their Secret": {"orchestrator": {"tokensSecret": None}},
    "a graph file outside its volume": {"pools": [pool("kg", KNOWLEDGE, graph={
        "file": "../etc/passwd", "volume": {"emptyDir": {}}})]},
    "an unknown NATS login": {"nats": {"url": "nats://nats:4222", "auth": "token",
                                       "tls": {"secretName": "", "clientCert": False}}},
    "Redis TLS without rediss://": {"redis": {"url": "redis://r:6379/", "auth": "users",
                                              "tls": {"secretName": "ca", "clientCert": False}}},
    # A pre-install hook runs before the release's own servers and Secret.
    "the setup as a hook with the dev servers": {"setup": {"useHelmHooks": True, "hookDeadlineSeconds": 240},
                                                 "dev": {"enabled": True}, "credentials": {"existingSecret": "s"}},
    "the setup as a hook with the chart's credentials": {"setup": {"useHelmHooks": True,
                                                                   "hookDeadlineSeconds": 240}},
    # Its sessions' keys are in every hash slot; it speaks to one server.
    "the console on a Redis Cluster": {"console": {"enabled": True},
                                       "redis": {"url": CLUSTER_REDIS, "cluster": True}},
    "the console's provider without its client id": {"console": {"enabled": True, "oidc": {
        "issuer": "https://id.example.com", "redirectUrl": "https://c.example.com/oidc/callback"}}},
    "a console session time that is no duration": {"console": {"sessionTtl": "eight hours"}},
}


def coalesce(defaults: dict, values: dict) -> dict:
    """The values a render uses, as Helm makes them: maps merged key by
    key, anything else (a list, a scalar) replaced whole."""
    out = dict(defaults)
    for key, value in values.items():
        both = isinstance(value, dict) and isinstance(defaults.get(key), dict)
        out[key] = coalesce(defaults[key], value) if both else value
    return out


def manifests(rendered: dict[str, str]) -> list[dict]:
    """The rendered manifests, NOTES.txt left out."""
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def pool_tools(values: dict) -> dict[str, list[str]]:
    """Each pool's tools, from the values the chart rendered with."""
    return {p["name"]: p["tools"] for p in values["pools"]}


def scaled_objects_match_pools(scaled: list[dict], docs: list[dict], tools: dict[str, list[str]]) -> list[str]:
    """Each ScaledObject scales a rendered pool on exactly the consumers of
    that pool's tools, in toolfleet's call stream."""
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    problems = []
    for obj in scaled:
        if obj["kind"] != "ScaledObject":
            continue
        target = obj["spec"]["scaleTargetRef"]["name"]
        deployment = deployments.get(target)
        if deployment is None:
            problems.append(f"{obj['metadata']['name']} scales {target}, which is not rendered")
            continue
        pool_tools = tools[deployment["metadata"]["labels"]["toolfleet.dev/pool"]]
        triggers = obj["spec"]["triggers"]
        consumers = sorted(t["metadata"]["consumer"] for t in triggers)
        if consumers != sorted(f"tool_{tool}" for tool in pool_tools):
            problems.append(f"{obj['metadata']['name']}: consumers {consumers} for tools {pool_tools}")
        for trigger in triggers:
            if trigger["type"] != "nats-jetstream" or trigger["metadata"]["stream"] != "TOOLFLEET_CALLS":
                problems.append(f"{obj['metadata']['name']}: trigger {trigger}")
            # KEDA runs in a namespace of its own: only a Service's full
            # name resolves from there.
            endpoint = trigger["metadata"]["natsServerMonitoringEndpoint"]
            if not re.fullmatch(r"[a-z0-9-]+\.[a-z0-9-]+\.svc\.cluster\.local:[0-9]+", endpoint):
                problems.append(f"{obj['metadata']['name']}: KEDA cannot resolve {endpoint} from its namespace")
    return problems


def lookup(config: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(config, dict):
            return None
        config = config.get(part)
    return config


def named_files(config: dict) -> list[str]:
    """Every file the configuration names (the keys `*_file`, `*_path`)."""
    files = []
    for key, value in config.items():
        if isinstance(value, dict):
            files.extend(named_files(value))
        elif isinstance(value, str) and key.endswith(("_file", "_path")):
            files.append(value)
    return files


def check_containers(docs: list[dict], checks: Checks, label: str, values: dict) -> None:
    tools = pool_tools(values)
    wanted = CONFIGURED.get(label, {})
    manifests = Manifests(docs, USER_SECRETS)
    with tempfile.TemporaryDirectory() as root:
        graph = os.path.join(root, "graph-volume")
        os.makedirs(os.path.join(graph, "graphs"))
        open(os.path.join(graph, "graphs", "companies.jsonl"), "w").close()
        for doc in manifests.workloads():
            component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
            if component in ("nats", "redis"):
                continue
            try:
                commands = manifests.commands(doc, os.path.join(root, doc["metadata"]["name"]), {"graph": graph})
            except Unresolved as err:
                checks.failures.append(f"{label}: {doc['kind']} {doc['metadata']['name']}: {err}")
                continue
            containers = doc["spec"]["template"]["spec"]["containers"]
            if component == "console":
                for container, command in zip(containers, commands):
                    checks.failures.extend(f"{label}: {command.where}: {f}"
                                           for f in check_console(checks, container, command, docs, values))
                continue
            for container, command in zip(containers, commands):
                where = f"{label}: {command.where}"
                if command.args[:1] == ["setup"]:
                    checks.setup(where, command.binary, command.args, command.env)
                    continue
                config = checks.service(where, command.binary, command.args, command.env)
                if config is None:
                    continue
                pool = command.labels.get("toolfleet.dev/pool")
                if pool is not None and config["tools"] != tools[pool]:
                    checks.failures.append(f"{where}: serves {config['tools']}, pool {pool} has {tools[pool]}")
                for key, value in wanted.get(pool or component, {}).items():
                    # A path inside the container is where its volume is here.
                    if isinstance(value, str) and value.startswith("/"):
                        value = command.path(value)
                    if lookup(config, key) != value:
                        checks.failures.append(f"{where}: {key} is {lookup(config, key)!r}, not {value!r}")
                for path in named_files(config):
                    if not os.path.exists(path):
                        checks.failures.append(f"{where}: names {path}, which no volume holds")
                # Every port the pod declares (and its Service and
                # NetworkPolicy name) is one the service listens on.
                declared = {p["containerPort"] for p in container.get("ports", [])}
                if not declared <= listen_ports(config):
                    checks.failures.append(f"{where}: declares ports {sorted(declared)}, "
                                           f"listens on {sorted(listen_ports(config))}")
                # The services export where the values say, or not at all.
                endpoint = values["telemetry"]["otlpEndpoint"] or None
                if config["telemetry"]["otlp_endpoint"] != endpoint:
                    checks.failures.append(f"{where}: exports to {config['telemetry']['otlp_endpoint']}, not {endpoint}")
                if doc["kind"] == "Deployment":
                    checks.failures.extend(f"{where}: {f}" for f in check_probes(container, config))


def check_console(checks: Checks, container: dict, command, docs: list[dict], values: dict) -> list[str]:
    """The console's command line loads in the `toolfleet` binary
    (`toolfleet console ... --print-config`) with every file it names
    mounted: it serves on the port its pod declares, which its probes ask
    for /healthz; it asks the orchestrators' Service on their gRPC port
    (https with their TLS); it logs in to Redis as `console` with a
    password wherever the chart's Redis users are."""
    checks.checked += 1
    done = run(checks.binary(os.path.basename(command.binary)), [*command.args, "--print-config"], command.env)
    if done.returncode != 0:
        return [f"{command.args} does not load:\n{done.stderr}"]
    config = json.loads(done.stdout)
    failures = []
    declared = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if config["listen"] != f"0.0.0.0:{declared.get('http')}":
        failures.append(f"listens on {config['listen']}, declares {declared}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http = container.get(probe, {}).get("httpGet") or {}
        port = declared.get(http.get("port"), http.get("port"))
        if http.get("path") != "/healthz" or port != declared.get("http"):
            failures.append(f"{probe}: GET {http.get('path')} on port {http.get('port')}, not /healthz on its own")
    o = values["orchestrator"]
    services = {d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]} for d in docs if d["kind"] == "Service"}
    orchestrator = next(n for n in services if n.endswith("-orchestrator"))
    scheme = "https" if o["tls"]["secretName"] else "http"
    addr = f"{scheme}://{orchestrator}.toolfleet.svc:{o['grpcPort']}"
    if config["orchestrator"]["addr"] != addr or o["grpcPort"] not in services[orchestrator]:
        failures.append(f"asks {config['orchestrator']['addr']}, not the orchestrators' Service at {addr}")
    users = values["redis"]["auth"] == "users"
    if (config["redis"]["user"], config["redis"]["password"]) != (("console", True) if users else ("", False)):
        failures.append(f"logs in to Redis as {config['redis']['user']!r} (password: {config['redis']['password']})")
    if config["key_prefix"] != "tf:":
        failures.append(f"keeps its sessions under {config['key_prefix']}, not the ACL's tf:")
    for path in named_files(config):
        if not os.path.exists(path):
            failures.append(f"names {path}, which no volume holds")
    return failures


# Each probe a service needs, and the path it must ask (docs/deploy.md).
PROBES = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}


def check_probes(container: dict, config: dict) -> list[str]:
    """A service's probes are HTTP GETs of the health paths on its
    plaintext metrics port: a port the container declares, by name or
    number, that the service (its `--print-config`) serves metrics on."""
    failures = []
    declared = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    metrics = int(config["metrics"]["listen"].rsplit(":", 1)[1])
    for probe, path in PROBES.items():
        http = container.get(probe, {}).get("httpGet")
        if http is None:
            failures.append(f"{probe}: not an HTTP probe")
            continue
        port = declared.get(http["port"], http["port"])
        if http.get("path") != path or port != metrics or http.get("scheme", "HTTP") != "HTTP":
            failures.append(f"{probe}: GET {http.get('path')} on port {http['port']}, "
                            f"not {path} on the metrics port {metrics}")
    return failures


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector selects a pod with `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if not {"In": key in labels and labels[key] in values,
                "NotIn": key not in labels or labels[key] not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[operator]:
            return False
    return True


def check_network_policies(docs: list[dict], release: str) -> list[str]:
    """Each NetworkPolicy selects pods of this chart's release only (not a
    worker of another chart in the same umbrella release), every pod of the
    release is selected by one, and no metrics port is open to sources
    outside the cluster."""
    failures = []
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if not policies:
        return failures
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in docs if d["kind"] in ("Deployment", "Job")}
    for name, labels in pods.items():
        if not any(selects(p["spec"]["podSelector"], labels) for p in policies):
            failures.append(f"no NetworkPolicy selects the pods of {name}")
    metrics_ports = {port["containerPort"] for d in docs if d["kind"] == "Deployment"
                     for c in d["spec"]["template"]["spec"]["containers"]
                     for port in c.get("ports", []) if port.get("name") == "metrics"}
    for policy in policies:
        selector = policy["spec"]["podSelector"]
        for component in ("worker", "orchestrator", "setup"):
            other = {"app.kubernetes.io/name": "another-chart", "app.kubernetes.io/instance": release,
                     "app.kubernetes.io/component": component}
            if selects(selector, other):
                failures.append(f"NetworkPolicy {policy['metadata']['name']} selects another chart's {component}")
        for rule in policy["spec"].get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            metrics = ports & metrics_ports
            if metrics and not rule.get("from"):
                failures.append(f"NetworkPolicy {policy['metadata']['name']}: port {sorted(metrics)} "
                                "is open to any source")
    return failures


def setup_job(values: dict | None, chart) -> dict:
    [job] = [d for d in manifests(chart.render(values, name="tf", namespace="toolfleet", is_install=True))
             if d["kind"] == "Job"]
    return job


def check_setup_job(chart, defaults: dict) -> list[str]:
    """By default the setup Job is a plain Job (a hook would deadlock
    `helm install --wait` and Argo CD, which run post-install hooks only once
    everything is ready), named by what it does: the same name on every
    render (no GitOps diff, no change to an immutable Job), a new one when
    the objects it makes change. As a hook it is pre-install/pre-upgrade,
    ends within its deadline, and reads a configuration hook made before it."""
    failures = []
    job = setup_job(None, chart)
    if "helm.sh/hook" in (job["metadata"].get("annotations") or {}):
        failures.append(f"the default setup Job is a Helm hook: {job['metadata']['annotations']}")
    if setup_job(None, chart)["metadata"]["name"] != job["metadata"]["name"]:
        failures.append("the setup Job's name changes between two renders of the same values")
    more = {"pools": [*defaults["pools"], pool("maps", ["geocode"])]}
    if setup_job(more, chart)["metadata"]["name"] == job["metadata"]["name"]:
        failures.append("a new tool leaves the setup Job's name as it was (its template cannot change in place)")
    replicas = {"nats": {**defaults["nats"], "replicas": 5}}
    if setup_job(replicas, chart)["metadata"]["name"] == job["metadata"]["name"]:
        failures.append("new stream settings leave the setup Job's name as it was")
    hooked = setup_job({"setup": {"useHelmHooks": True, "hookDeadlineSeconds": 200},
                        "credentials": {"existingSecret": "s"}}, chart)
    annotations = hooked["metadata"].get("annotations") or {}
    if annotations.get("helm.sh/hook") != "pre-install,pre-upgrade" or hooked["spec"].get("activeDeadlineSeconds") != 200:
        failures.append(f"the setup hook: {annotations}, deadline {hooked['spec'].get('activeDeadlineSeconds')}")
    return failures


def check_release_chart() -> list[str]:
    """scripts/release-chart, as the release workflow runs it: the copy
    lints, carries the release's version, and its pods run the images the
    release pushed, by digest; a bad version or digest is refused."""
    failures = []
    script = os.path.join(ROOT, "scripts", "release-chart")
    orchestrator, worker = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([script, "1.2.3-rc.1", "ghcr.io/acme", orchestrator, worker, out],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return [f"release-chart: {done.stderr}"]
        copy = done.stdout.strip()
        lint = helm_python.lint(copy, strict=True)
        failures.extend(f"release chart lint: {m['error']}" for m in lint["messages"] if m["severity"] >= 2)
        docs = manifests(helm_python.Chart.load(copy).render(None, name="tf", namespace="toolfleet", is_install=True))
        for doc in (d for d in docs if d["kind"] in ("Deployment", "Job")):
            image = doc["spec"]["template"]["spec"]["containers"][0]["image"]
            want = (f"ghcr.io/acme/toolfleet-worker@{worker}" if "worker" in image
                    else f"ghcr.io/acme/toolfleet-orchestrator@{orchestrator}")
            if image != want or doc["metadata"]["labels"]["app.kubernetes.io/version"] != "1.2.3-rc.1":
                failures.append(f"release chart: {doc['metadata']['name']} runs {image}, "
                                f"version {doc['metadata']['labels']['app.kubernetes.io/version']}")
        for bad in (["v1.2.3", "ghcr.io/acme", orchestrator, worker], ["1.2.3", "ghcr.io/acme", "latest", worker]):
            if subprocess.run([script, *bad, out], capture_output=True, timeout=60).returncode == 0:
                failures.append(f"release-chart took {bad}")
    return failures


def check_rollouts(docs: list[dict], values: dict) -> list[str]:
    """Every Deployment of the orchestrators and the pools rolls as its
    values say: one new pod at a time by default, never one ready pod
    fewer, each new one ready for a while before the next old one stops."""
    failures = []
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        own = {"orchestrator": values["orchestrator"], "worker": values["worker"]}.get(component)
        if own is None:
            continue
        rollout = own["rollout"]
        expected = ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": rollout["maxSurge"],
                                                                 "maxUnavailable": rollout["maxUnavailable"]}},
                    rollout["minReadySeconds"])
        found = (doc["spec"].get("strategy"), doc["spec"].get("minReadySeconds"))
        if found != expected:
            failures.append(f"{doc['metadata']['name']} rolls out as {found}, not {expected}")
    return failures


def check_names(docs: list[dict]) -> list[str]:
    """Every object's name is a DNS label (a Service's must be; a pod's
    hostname comes from its Deployment's), and unique within its kind."""
    failures = []
    seen = set()
    for doc in docs:
        name = doc["metadata"]["name"]
        if len(name) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
            failures.append(f"{doc['kind']} {name}: not a DNS label of at most 63 characters")
        if (doc["kind"], name) in seen:
            failures.append(f"two {doc['kind']} objects named {name}")
        seen.add((doc["kind"], name))
    return failures


def check_observability(docs: list[dict]) -> list[str]:
    """The PrometheusRule and the dashboard ConfigMap ship
    deploy/observability's files as they are."""
    failures = []
    with open(os.path.join(ROOT, "deploy/observability/alerts.yml")) as f:
        alerts = yaml.safe_load(f)
    with open(os.path.join(ROOT, "deploy/observability/grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    for doc in docs:
        if doc["kind"] == "PrometheusRule" and doc["spec"] != alerts:
            failures.append("the PrometheusRule is not deploy/observability/alerts.yml")
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard"):
            if json.loads(doc["data"]["toolfleet.json"]) != dashboard:
                failures.append("the dashboard ConfigMap is not deploy/observability/grafana-dashboard.json")
    return failures


def nats_accounts(conf: str) -> dict[str, dict]:
    """Each account of a NATS accounts file: its users and the subjects each
    may use, what it exports (subject, to which accounts, response type) and
    what it imports (subject, as which local subject)."""
    text = re.sub(r"#[^\n]*", "", conf)
    text = re.sub(r"\n\s*password: [^\n]*", "", text)
    heads = list(re.finditer(r'^  "?([\w-]+)"?: \{$', text, re.M))
    accounts = {}
    for head, after in zip(heads, [*heads[1:], None]):
        body = text[head.end():after.start() if after else len(text)]

        def section(name: str) -> str:
            match = re.search(rf"\n    {name}: \[(.*?)\n    \]", body, re.S)
            return match[1] if match else ""

        users = {block.split()[0]: set(re.findall(r'"([^"]+)"', block))
                 for block in re.split(r"\n\s*user: ", section("users"))[1:]}
        exports = set()
        for line in section("exports").strip().splitlines():
            subject = re.search(r'service: "([^"]+)"', line)[1]
            to = tuple(re.findall(r'"([^"]+)"', line.split("accounts:")[1]))
            exports.add((subject, to, "stream" if "response_type: stream" in line else "single"))
        imports = set()
        for line in section("imports").strip().splitlines():
            subject = re.search(r'subject: "([^"]+)"', line)[1]
            to = re.search(r'to: "([^"]+)"', line)
            imports.add((re.search(r"account: (\w+)", line)[1], subject, to[1] if to else subject))
        accounts[head[1]] = {"users": users, "exports": exports, "imports": imports}
    return accounts


def redis_users(conf: str) -> dict[str, str]:
    """Each user line of a Redis ACL file, its password hash blanked."""
    return {m[1]: re.sub(r"#\S+", "#", m[0]) for m in re.finditer(r"^user (\S+) .*$", conf, re.M)}


def users_files(docs: list[dict]) -> tuple[str, str]:
    """The NATS users file and the Redis ACL file the chart rendered."""
    manifests = Manifests(docs)
    nats = next(n for n in manifests.secrets if n.endswith("-nats-users"))
    redis = next(n for n in manifests.secrets if n.endswith("-redis-users"))
    return manifests.secrets[nats]["toolfleet-users.conf"], manifests.secrets[redis]["toolfleet-users.conf"]


def nats_placeholders(conf: str) -> str:
    """A NATS users file with each password written in it replaced by the
    environment variable deploy/nats's file reads it from."""
    return re.sub(r'(user: (\S+)\n\s+password: )"\$2[aby]\$[^"]+"',
                  lambda m: f"{m[1]}$TOOLFLEET_NATS_{m[2].upper().replace('-', '_')}_PASSWORD_BCRYPT", conf)


def check_new_pool_credentials(chart, defaults: dict, bin_dir: str) -> list[str]:
    """`toolfleet-orchestrator credentials --pool maps` prints the Secret's
    keys and the values that add the pool maps to a release whose passwords
    GitOps keeps: the hashes are of the passwords, and with the pool added
    the chart's users files carry exactly them. A name the chart would
    refuse is refused (exit 2)."""
    command = [os.path.join(bin_dir, "toolfleet-orchestrator"), "credentials"]
    done = subprocess.run([*command, "--pool", "maps", "--secret", "fleet-passwords"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return [f"credentials: exit {done.returncode}: {done.stderr}"]
    failures = []
    secret, values = yaml.safe_load_all(done.stdout)
    passwords = secret["stringData"]
    if (secret["kind"], secret["metadata"]["name"], sorted(passwords)) != \
            ("Secret", "fleet-passwords", ["nats-pool-maps", "redis-pool-maps"]):
        failures.append(f"credentials: the Secret printed is {secret}")
    hashes = values["credentials"]["passwordHashes"]
    nats_hash, redis_hash = hashes["nats"]["pool-maps"], hashes["redis"]["pool-maps"]
    if not bcrypt.checkpw(passwords["nats-pool-maps"].encode(), nats_hash.encode()):
        failures.append("credentials: the NATS hash is not of the NATS password")
    if hashlib.sha256(passwords["redis-pool-maps"].encode()).hexdigest() != redis_hash:
        failures.append("credentials: the Redis hash is not of the Redis password")
    # Every other Redis user has a hash of its own (else no Redis file).
    others = {user: "0" * 64 for user in ["orchestrator", *(f"pool-{p['name']}" for p in defaults["pools"])]}
    added = {"credentials": {"existingSecret": values["credentials"]["existingSecret"],
                             "passwordHashes": {"nats": hashes["nats"], "redis": {**others, **hashes["redis"]}}},
             "pools": [*defaults["pools"], pool("maps", ["geocode"])]}
    nats, redis = users_files(manifests(chart.render(added, name="tf", namespace="toolfleet", is_install=True)))
    if not re.search(r'user: pool-maps\n\s+password: "' + re.escape(nats_hash) + '"', nats):
        failures.append("credentials: the NATS users file does not carry the pool's hash")
    if f"\nuser pool-maps on #{redis_hash} " not in redis:
        failures.append("credentials: the Redis users file does not carry the pool's hash")
    refused = subprocess.run([*command, "--pool", "Maps"], capture_output=True, text=True, timeout=60)
    if refused.returncode != 2 or "is not a pool name of the chart" not in refused.stderr or refused.stdout:
        failures.append(f"credentials --pool Maps: exit {refused.returncode}, {refused.stderr!r}")
    return failures


def check_users(chart, defaults: dict) -> list[str]:
    """The default pools' users are deploy/'s files; one more pool adds
    exactly its own users, allowed exactly its tools."""
    failures = []
    nats, redis = users_files(manifests(chart.render(None, name="tf", namespace="toolfleet", is_install=True)))
    with open(os.path.join(ROOT, "deploy/nats/toolfleet-users.conf")) as f:
        if f.read() != nats_placeholders(nats):
            failures.append("deploy/nats/toolfleet-users.conf is not what the chart renders for its default pools")
    # deploy/redis's file carries the console's user too, for whoever runs
    # the console; the chart renders it only with the console enabled.
    with_console = {"console": {**defaults["console"], "enabled": True}}
    console_redis = users_files(manifests(chart.render(with_console, name="tf", namespace="toolfleet",
                                                       is_install=True)))[1]
    with open(os.path.join(ROOT, "deploy/redis/toolfleet-users.conf")) as f:
        placeholders = re.sub(r"user (\S+) on #[0-9a-f]{64}",
                              lambda m: f"user {m[1]} on #@{m[1].upper().replace('-', '_')}_PASSWORD_SHA256@",
                              console_redis)
        if f.read() != placeholders:
            failures.append("deploy/redis/toolfleet-users.conf is not what the chart renders for its default pools "
                            "with the console enabled")
    if "console" in redis_users(redis) or \
            {k: v for k, v in redis_users(console_redis).items() if k != "console"} != redis_users(redis):
        failures.append("the console enabled changes more in the Redis users than its own user, or disabled "
                        "leaves its user in")
    console_user = ("user console on # resetchannels ~tf:console:* -@all +@connection -@dangerous "
                    "+hmset +hgetall +expire +del +setex +getdel +multi +exec +discard")
    if redis_users(console_redis).get("console") != console_user:
        failures.append(f"the console's Redis user is {redis_users(console_redis).get('console')!r}")
    # Users files made where the servers run, another namespace than the
    # release's, which their pods can mount.
    elsewhere = manifests(chart.render({"nats": {**defaults["nats"], "usersNamespace": "messaging"},
                                        "redis": {**defaults["redis"], "usersNamespace": "cache"}},
                                       name="tf", namespace="toolfleet", is_install=True))
    placed = {d["metadata"]["name"]: d["metadata"].get("namespace") for d in elsewhere if d["kind"] == "Secret"}
    if placed != {"tf-toolfleet-credentials": None, "tf-toolfleet-nats-users": "messaging",
                  "tf-toolfleet-redis-users": "cache"}:
        failures.append(f"users files in other namespaces: {placed}")
    if "\nuser default off\n" not in redis:
        failures.append("the Redis users file leaves the default user on")
    kept = users_files(manifests(chart.render({"redis": {**defaults["redis"], "defaultUser": "keep"}},
                                              name="tf", namespace="toolfleet", is_install=True)))[1]
    if re.search(r"^user default", kept, re.M) or redis_users(kept) != {k: v for k, v in redis_users(redis).items()
                                                                       if k != "default"}:
        failures.append("redis.defaultUser: keep changes more than the default user's line")
    more = {"pools": [*defaults["pools"], pool("maps", ["geocode", "route-plan"])]}
    more_nats, more_redis = users_files(manifests(chart.render(more, name="tf", namespace="toolfleet", is_install=True)))
    # One more pool: an account of its own whose user may use exactly what
    # it imports, and the account toolfleet exports exactly its tools' to
    # it, and the reply subjects to it as to every pool.
    tools = ("geocode", "route-plan")
    served = [(api, f"CONSUMER.{api}.TOOLFLEET_CALLS.tool_{tool}") for tool in tools for api in ("INFO", "MSG.NEXT")]
    own = [*(f"$JS.ACK.TOOLFLEET_CALLS.tool_{tool}.>" for tool in tools),
           *(f"$KV.toolfleet_registry.{tool}.>" for tool in tools)]
    accounts = nats_accounts(nats)
    toolfleet = accounts["toolfleet"]
    pools = sorted(name for name in accounts if name != "toolfleet")
    replies = ("toolfleet.reply.*", tuple(pools), "single")
    expected = {**accounts, "toolfleet": {**toolfleet, "exports": {
        *(e for e in toolfleet["exports"] if e != replies),
        ("toolfleet.reply.*", tuple(sorted([*pools, "pool-maps"])), "single"),
        *((f"$JS.API.{api}", ("pool-maps",), "stream" if kind == "MSG.NEXT" else "single") for kind, api in served),
        *((subject, ("pool-maps",), "single") for subject in own),
    }}, "pool-maps": {
        "users": {"pool-maps": {"toolfleet.reply.*", "_INBOX.pool-maps.>",
                                *(f"JS.toolfleet.API.{api}" for _, api in served), *own}},
        "exports": set(),
        "imports": {("toolfleet", "toolfleet.reply.*", "toolfleet.reply.*"),
                    *(("toolfleet", f"$JS.API.{api}", f"JS.toolfleet.API.{api}") for _, api in served),
                    *(("toolfleet", subject, subject) for subject in own)},
    }}
    if nats_accounts(more_nats) != expected:
        failures.append(f"one more pool: NATS accounts {nats_accounts(more_nats)}, not {expected}")
    # A tool served by two pools: its consumer, acks and registry keys are
    # exported to both, and each pool's account imports them.
    shared_tool = defaults["pools"][0]["tools"][0]
    first = f"pool-{defaults['pools'][0]['name']}"
    shared = nats_accounts(users_files(manifests(chart.render(
        {"pools": [*defaults["pools"], pool("copy", [shared_tool])]},
        name="tf", namespace="toolfleet", is_install=True)))[0])
    both = (first, "pool-copy")
    for subject in (f"$JS.API.CONSUMER.INFO.TOOLFLEET_CALLS.tool_{shared_tool}",
                    f"$JS.ACK.TOOLFLEET_CALLS.tool_{shared_tool}.>", f"$KV.toolfleet_registry.{shared_tool}.>"):
        if (subject, both, "single") not in shared["toolfleet"]["exports"]:
            failures.append(f"a tool in two pools: {subject} is not exported to both: {shared['toolfleet']['exports']}")
        if not any(i[1] == subject for i in shared["pool-copy"]["imports"]):
            failures.append(f"a tool in two pools: the second pool does not import {subject}")
    expected_redis = {**redis_users(redis), "pool-maps": (
        "user pool-maps on # resetchannels ~tf:{*}:tool:geocode:* ~tf:{*}:tool:route-plan:* "
        "-@all +@read +@write +@scripting +@connection -@dangerous -keys -scan -randomkey -function -script|flush -script|kill +cluster|slots")}
    if redis_users(more_redis) != expected_redis:
        failures.append(f"one more pool: Redis users {redis_users(more_redis)}, not {expected_redis}")
    return failures


def main() -> int:
    chart_dir, bin_dir, nats_url = sys.argv[1:4]
    with open(os.path.join(chart_dir, "values.yaml")) as f:
        defaults = yaml.safe_load(f)
    failures = []
    lint = helm_python.lint(chart_dir, strict=True)
    for message in lint["messages"]:
        if message["severity"] >= 2:
            failures.append(f"lint: {message['path']}: {message['error']}")
    failures.extend(f"lint: {error}" for error in lint["errors"])
    chart = helm_python.Chart.load(chart_dir)
    failures.extend(check_users(chart, defaults))
    failures.extend(check_new_pool_credentials(chart, defaults, bin_dir))
    failures.extend(check_setup_job(chart, defaults))
    failures.extend(check_release_chart())
    validated = 0
    for label, values in VALUE_SETS.items():
        if isinstance(values, str):
            with open(os.path.join(chart_dir, values)) as f:
                values = yaml.safe_load(f)
        checks = Checks(bin_dir, nats_url)
        release = RELEASE_NAMES.get(label, "tf")
        rendered = chart.render(values, name=release, namespace="toolfleet", is_install=True)
        docs = manifests(rendered)
        failures.extend(f"{label}: {f}" for f in check_names(docs))
        failures.extend(f"{label}: {f}" for f in check_rollouts(docs, coalesce(defaults, values or {})))
        failures.extend(f"{label}: {f}" for f in check_network_policies(docs, release))
        for kind, count in KINDS[label].items():
            found = sum(1 for doc in docs if doc["kind"] == kind)
            if found != count:
                failures.append(f"{label}: {found} {kind} rendered, not {count}")
        custom = [doc for doc in docs if doc["apiVersion"] in CUSTOM]
        for doc in docs:
            if doc in custom:
                continue
            try:
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)
                validated += 1
            except kubernetes_validate.ValidationError as err:
                failures.append(f"{label}: {doc['kind']} {doc['metadata']['name']}: {err.message}")
        effective = coalesce(defaults, values or {})
        if custom:
            done = subprocess.run(
                ["node", os.path.join(HERE, "crds.mjs")],
                input=json.dumps(custom), capture_output=True, text=True, timeout=60,
            )
            if done.returncode != 0:
                failures.append(f"{label}: custom resources:\n{done.stdout}{done.stderr}")
            else:
                validated += len(custom)
            failures.extend(f"{label}: {f}" for f in scaled_objects_match_pools(custom, docs, pool_tools(effective)))
        failures.extend(f"{label}: {f}" for f in check_observability(docs))
        if values is PLATFORM:
            failures.extend(f"{label}: {f}" for f in check_platform(docs))
        check_containers(docs, checks, label, effective)
        if checks.finish(f"chart ({label})", 3) != 0:
            failures.extend(checks.failures or [f"{label}: too few containers"])
    for label, values in REFUSED.items():
        try:
            chart.render(values, name="tf", namespace="toolfleet", is_install=True)
            failures.append(f"the values with {label} rendered")
        except helm_python.HelmError:
            pass
    print(f"chart: {len(VALUE_SETS)} value sets, {validated} manifests valid for Kubernetes {KUBERNETES}, "
          f"{len(REFUSED)} bad value sets refused")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
