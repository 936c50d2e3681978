"""Renders k8s/ from the Helm chart, so that users without Helm get the same
configuration: one owner (deploy/helm/toolfleet), and k8s/ its output.

- k8s/base: the chart with its defaults, except that objects are named
  toolfleet-<part>, NATS and Redis are the Services `nats` and `redis` of
  the namespace (an ExternalName Service points them anywhere), and the
  passwords come from the Secret toolfleet-credentials, which an overlay or
  the operator makes. Helm's own labels and hooks are left out.
- k8s/overlays/dev: the base, the chart's single dev NATS and Redis (with
  the users generated from the pools; the streams keep one copy there) and
  generated Secrets holding fixed dev passwords and a dev token: for trying
  it out, never for production.
- k8s/overlays/prod: the base in its own namespace, pinned images, more
  orchestrator replicas; the operator creates the Secrets (k8s/README.md).

Usage: render_k8s.py CHART_DIR K8S_DIR [--check]
With --check, writes nothing and exits 1 if K8S_DIR differs from what it
would write.
"""

import hashlib
import json
import os
import re
import sys

import bcrypt
import helm_python
import yaml

HEADER = "# Rendered from deploy/helm/toolfleet by tests/deploy/render_k8s.py: edit the chart, then rerun it.\n"

BASE_VALUES = {
    "fullnameOverride": "toolfleet",
    "nats": {"url": "nats://nats:4222", "auth": "users"},
    "redis": {"url": "redis://redis:6379/", "auth": "users"},
    "credentials": {"existingSecret": "toolfleet-credentials", "passwordHashes": {"nats": {}, "redis": {}}},
}

# The dev overlay's passwords and API token: in the repository, so never
# for anything but trying toolfleet out.
DEV_TOKEN = "dev-token-not-secret"


def dev_password(key: str) -> str:
    return f"dev-{key}-not-secret"


# bcrypt with a fixed salt, so that rendering is reproducible (--check).
DEV_SALT = b"$2b$10$vd2MRevhkY5PFCd0pi8PBO"


def dev_secret(key: str) -> str:
    """The dev overlay's value of a credentials key, as a kustomize literal:
    a password, or (nats-<user>-bcrypt) its bcrypt hash in the double quotes
    the NATS server wants, inside single quotes that kustomize strips."""
    if key.endswith("-bcrypt"):
        hashed = bcrypt.hashpw(dev_password(key.removesuffix("-bcrypt")).encode(), DEV_SALT).decode()
        return f"'\"{hashed}\"'"
    return dev_password(key)


def render(chart, values: dict) -> dict[str, list[dict]]:
    """The chart's manifests for `values`, by template file name."""
    rendered = chart.render(values, name="toolfleet", namespace="toolfleet", is_install=True)
    out = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
        if docs:
            out[os.path.basename(path)] = [plain(doc) for doc in docs]
    return out


def plain(doc: dict) -> dict:
    """`doc` without what only Helm uses: its labels, hooks and the config
    checksum (kustomize users roll pods with `kubectl rollout restart`)."""
    def strip(meta: dict) -> None:
        labels = meta.get("labels") or {}
        for label in ("helm.sh/chart", "app.kubernetes.io/managed-by"):
            labels.pop(label, None)
        annotations = meta.get("annotations") or {}
        for key in list(annotations):
            if key.startswith("helm.sh/") or key.startswith("checksum/"):
                del annotations[key]
        if "annotations" in meta and not annotations:
            del meta["annotations"]

    strip(doc["metadata"])
    template = doc.get("spec", {}).get("template")
    if template:
        strip(template["metadata"])
    return doc


def dump(docs: list[dict]) -> str:
    return HEADER + "---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in docs)


def files(chart_dir: str) -> dict[str, str]:
    """Every file of k8s/ this renders, by path under it."""
    chart = helm_python.Chart.load(chart_dir)
    out = {}

    base = render(chart, BASE_VALUES)
    for name in sorted(base):
        out[f"base/{name}"] = dump(base[name])
    out["base/kustomization.yaml"] = HEADER + yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "labels": [{"pairs": {"app.kubernetes.io/managed-by": "kustomize"}}],
        "resources": sorted(base),
    }, sort_keys=False)

    with open(os.path.join(chart_dir, "values-dev.yaml")) as f:
        dev_values = yaml.safe_load(f)
    dev = render(chart, {**BASE_VALUES, **dev_values, "orchestrator": {**dev_values["orchestrator"], "auth": "tokens"}})
    servers = dev["dev.yaml"]
    # The base reaches them as `nats` and `redis`.
    for doc in servers:
        if doc["kind"] == "Service":
            doc["metadata"]["name"] = doc["metadata"]["labels"]["app.kubernetes.io/component"]
    out["overlays/dev/servers.yaml"] = dump(servers)
    # The Secrets the chart makes when it may: the same keys, and its Redis
    # users file with the dev passwords' hashes.
    generated = render(chart, {**BASE_VALUES, "credentials": {"existingSecret": "", "passwordHashes": {"nats": {}, "redis": {}}}})
    secrets = {d["metadata"]["name"]: d for d in generated["credentials.yaml"]}
    keys = sorted(secrets["toolfleet-credentials"]["data"])
    redis_file = secrets["toolfleet-redis-users"]
    acl = re.sub(r"user (\S+) on #[0-9a-f]{64}",
                 lambda m: f"user {m[1]} on #{hashlib.sha256(dev_password('redis-' + m[1]).encode()).hexdigest()}",
                 redis_file["stringData"]["toolfleet-users.conf"])
    out["overlays/dev/redis-users.conf"] = acl
    out["overlays/dev/tokens.toml"] = (
        f"# The dev overlay's one tenant; its token is {DEV_TOKEN!r} (docs/security.md).\n"
        f"[tenants.dev]\ntoken_sha256 = [\"{hashlib.sha256(DEV_TOKEN.encode()).hexdigest()}\"]\n"
    )
    out["overlays/dev/kustomization.yaml"] = HEADER + (
        "# Not for production: fixed passwords and token, single NATS and Redis\n"
        "# whose data lives as long as their pods.\n"
    ) + yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base", "servers.yaml"],
        "replicas": [{"name": "toolfleet-orchestrator", "count": 1}],
        # The base keeps 3 copies of each stream (nats.replicas); the dev
        # NATS is one server, and the setup Job is what creates the streams.
        "patches": [{
            "target": {"kind": "Job", "labelSelector": "app.kubernetes.io/component=setup"},
            "patch": json.dumps([{
                "op": "add", "path": "/spec/template/spec/containers/0/env/-",
                "value": {"name": "TOOLFLEET_NATS__REPLICAS", "value": "1"},
            }]),
        }],
        "secretGenerator": [
            {"name": "toolfleet-credentials", "literals": [f"{key}={dev_secret(key)}" for key in keys]},
            {"name": "toolfleet-redis-users", "files": ["toolfleet-users.conf=redis-users.conf"]},
            {"name": "toolfleet-tokens", "files": ["tokens.toml"]},
        ],
        "generatorOptions": {"disableNameSuffixHash": True},
    }, sort_keys=False)

    out["overlays/prod/kustomization.yaml"] = HEADER + (
        "# Create the Secrets toolfleet-credentials and toolfleet-tokens in the\n"
        "# namespace first, and point the Services nats and redis at your servers\n"
        "# (k8s/README.md).\n"
    ) + yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "toolfleet",
        "resources": ["../../base"],
        "replicas": [{"name": "toolfleet-orchestrator", "count": 3}],
        "images": [{"name": "toolfleet-orchestrator", "newTag": "0.1.0"},
                   {"name": "toolfleet-worker", "newTag": "0.1.0"}],
    }, sort_keys=False)
    return out


def main() -> int:
    chart_dir, k8s_dir = sys.argv[1:3]
    check = "--check" in sys.argv[3:]
    stale = []
    wanted = files(chart_dir)
    for path, text in wanted.items():
        target = os.path.join(k8s_dir, path)
        current = open(target).read() if os.path.exists(target) else None
        if current != text:
            stale.append(path)
            if not check:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w") as f:
                    f.write(text)
    # Files of base/ and overlays/ that the chart no longer renders.
    for sub in ("base", "overlays/dev", "overlays/prod"):
        for name in os.listdir(os.path.join(k8s_dir, sub)) if os.path.isdir(os.path.join(k8s_dir, sub)) else []:
            if f"{sub}/{name}" not in wanted:
                stale.append(f"{sub}/{name} (not rendered)")
                if not check:
                    os.remove(os.path.join(k8s_dir, sub, name))
    if check and stale:
        print(f"FAIL k8s/ is not what the chart renders: {', '.join(stale)}; run tests/deploy/render_k8s.py")
        return 1
    print(f"k8s: {len(wanted)} files {'checked' if check else 'rendered'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
