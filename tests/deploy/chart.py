"""Checks the Helm chart deploy/helm/toolfleet without a cluster or a helm
binary, through the Helm v4 SDK (helm-python-sdk):

- `helm lint --strict` finds no error and no warning;
- it renders with its default values and with other value sets, and every
  manifest validates (kubernetes-validate, strict) against a current
  Kubernetes;
- values the schema forbids fail the render;
- every container of every rendered Deployment and Job runs in the
  workspace's own binary: the setup Job for real against the test NATS
  server, the services' commands and environments load (`--print-config`),
  the workers serve exactly the tools the setup creates consumers for, and
  every probe is a subcommand of the container's binary.

Usage: chart.py CHART_DIR BIN_DIR NATS_URL
"""

import json
import os
import subprocess
import sys

import helm_python
import kubernetes_validate
import yaml

from common import Checks

KUBERNETES = kubernetes_validate.latest_version()

# Value sets beside the defaults; each must render and validate.
VALUE_SETS = {
    "defaults": None,
    "one pool, external NATS and Redis over TLS, no auth": {
        "nats": {"url": "tls://nats.messaging.svc:4222"},
        "redis": {"url": "rediss://redis.cache.svc:6380/"},
        "orchestrator": {"auth": "none"},
        "telemetry": {"otlpEndpoint": "http://otel-collector.observability:4318",
                      "otlpProtocol": "http/protobuf", "sampleRatio": 0.05},
        "pools": [
            {
                "name": "everything",
                "tools": ["calculate", "get_current_weather", "factual_qa", "trend_analysis"],
                "replicas": 3,
                "autoscaling": {"enabled": False, "minReplicas": 1, "maxReplicas": 1, "targetCPU": 70, "lagThreshold": 10},
                "maxInFlight": 64,
                "resources": {},
            }
        ],
    },
    "without network policies, every pool autoscaled": {
        "networkPolicy": {"enabled": False, "grpcFrom": [], "metricsFrom": [], "egressPorts": [4222]},
        "pools": [
            {
                "name": name,
                "tools": tools,
                "replicas": 1,
                "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 20, "targetCPU": 60, "lagThreshold": 10},
                "maxInFlight": 8,
                "resources": {"requests": {"cpu": "100m"}},
            }
            for name, tools in [("math", ["calculate"]), ("weather", ["get_current_weather"])]
        ],
    },
    "no service account of its own": {
        "serviceAccount": {"create": False, "name": "tool-runner"},
    },
    "KEDA, every pool scaling to zero": {
        "keda": {"enabled": True, "natsMonitoringEndpoint": "nats.messaging.svc:8222", "account": "$G"},
        "pools": [
            {
                "name": name,
                "tools": tools,
                "replicas": 1,
                "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 8, "targetCPU": 70, "lagThreshold": 16},
                "maxInFlight": 16,
                "resources": {},
            }
            for name, tools in [("general", ["calculate", "get_current_weather"]),
                                ("knowledge", ["factual_qa", "trend_analysis"])]
        ],
    },
}

# What each value set must render, by kind.
KINDS = {
    "defaults": {"Deployment": 3, "Service": 1, "PodDisruptionBudget": 1, "Job": 1,
                 "ServiceAccount": 1, "NetworkPolicy": 2, "HorizontalPodAutoscaler": 1},
    "one pool, external NATS and Redis over TLS, no auth": {"Deployment": 2, "NetworkPolicy": 2,
                                                            "HorizontalPodAutoscaler": 0},
    "without network policies, every pool autoscaled": {"Deployment": 3, "NetworkPolicy": 0,
                                                        "HorizontalPodAutoscaler": 2},
    "no service account of its own": {"ServiceAccount": 0, "Deployment": 3},
    "KEDA, every pool scaling to zero": {"Deployment": 3, "ScaledObject": 2, "HorizontalPodAutoscaler": 0},
}

# Kinds that are CRDs, validated against their CRD's schema (crds.mjs).
CUSTOM = {"keda.sh/v1alpha1"}

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
    "no pool": {"pools": []},
    "a plain-text Redis URL scheme typo": {"redis": {"url": "redis:/oops"}},
    "tokens without their Secret": {"orchestrator": {"tokensSecret": None}},
}


def manifests(rendered: dict[str, str]) -> list[dict]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def scaled_objects_match_pools(scaled: list[dict], docs: list[dict]) -> list[str]:
    """Each ScaledObject scales a rendered pool on exactly the consumers of
    that pool's tools, in toolfleet's call stream."""
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    problems = []
    for obj in scaled:
        target = obj["spec"]["scaleTargetRef"]["name"]
        deployment = deployments.get(target)
        if deployment is None:
            problems.append(f"{obj['metadata']['name']} scales {target}, which is not rendered")
            continue
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        tools = args[args.index("--tools") + 1].split(",")
        triggers = obj["spec"]["triggers"]
        consumers = sorted(t["metadata"]["consumer"] for t in triggers)
        if consumers != sorted(f"tool_{tool}" for tool in tools):
            problems.append(f"{obj['metadata']['name']}: consumers {consumers} for tools {tools}")
        for trigger in triggers:
            if trigger["type"] != "nats-jetstream" or trigger["metadata"]["stream"] != "TOOLFLEET_CALLS":
                problems.append(f"{obj['metadata']['name']}: trigger {trigger}")
    return problems


def container_env(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet gives it; a field
    reference gets a pod name."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = "pod-0"
    return env


def check_containers(docs: list[dict], checks: Checks, label: str, values: dict | None) -> None:
    # The images' own environment (deploy/Dockerfile) under the chart's.
    image_env = {"TOOLFLEET_LOG__FORMAT": "json"}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            where = f"{label}: {doc['kind']} {doc['metadata']['name']}"
            image = container["image"].split(":")[0]
            binary = "toolfleet-worker" if "worker" in image else "toolfleet-orchestrator"
            args = [str(a) for a in container.get("args", [])]
            env = {**image_env, **container_env(container)}
            if args[:1] == ["setup"]:
                checks.setup(where, binary, args, env)
            else:
                config = checks.service(where, binary, args, env)
                # The services export where the values say, or not at all.
                wanted = ((values or {}).get("telemetry") or {}).get("otlpEndpoint") or None
                if config and config["telemetry"]["otlp_endpoint"] != wanted:
                    checks.failures.append(
                        f"{where}: exports to {config['telemetry']['otlp_endpoint']}, not {wanted}"
                    )
            for probe in ("readinessProbe", "livenessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command")
                if command:
                    checks.probe(f"{where} {probe}", binary, command)
                elif doc["kind"] == "Deployment":
                    checks.failures.append(f"{where}: no exec {probe}")


def main() -> int:
    chart_dir, bin_dir, nats_url = sys.argv[1:4]
    failures = []
    lint = helm_python.lint(chart_dir, strict=True)
    for message in lint["messages"]:
        if message["severity"] >= 2:
            failures.append(f"lint: {message['path']}: {message['error']}")
    failures.extend(f"lint: {error}" for error in lint["errors"])
    chart = helm_python.Chart.load(chart_dir)
    validated = 0
    for label, values in VALUE_SETS.items():
        checks = Checks(bin_dir, nats_url)
        rendered = chart.render(values, name="tf", namespace="toolfleet", is_install=True)
        docs = manifests(rendered)
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
        if custom:
            done = subprocess.run(
                ["node", os.path.join(os.path.dirname(__file__), "crds.mjs")],
                input=json.dumps(custom), capture_output=True, text=True, timeout=60,
            )
            if done.returncode != 0:
                failures.append(f"{label}: custom resources:\n{done.stdout}{done.stderr}")
            else:
                validated += len(custom)
            failures.extend(f"{label}: {f}" for f in scaled_objects_match_pools(custom, docs))
        check_containers(docs, checks, label, values)
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
