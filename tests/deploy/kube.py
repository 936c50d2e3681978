"""Runs what rendered Kubernetes manifests configure, without Kubernetes:
each container becomes a local command line with the environment and the
files the kubelet would give it.

A pod's ConfigMap and Secret volumes are written under a directory of
the test's, and every mount path in the container's environment and in
those files is rewritten to point there. Environment variables from
Secrets and field references resolve as the kubelet would resolve them.
"""

import base64
import os
from dataclasses import dataclass, field

# The images, each named after the binary it runs (deploy/Dockerfile's targets).
BINARIES = ("toolfleet-orchestrator", "toolfleet-worker")


class Unresolved(Exception):
    """A container refers to something the manifests do not hold."""


@dataclass
class Command:
    """One container, as a local process would run it."""

    where: str
    binary: str
    args: list[str]
    env: dict[str, str]
    # Mount path -> the local directory standing for it.
    mounts: dict[str, str] = field(default_factory=dict)
    # The Deployment's or Job's labels.
    labels: dict[str, str] = field(default_factory=dict)

    def path(self, mounted: str) -> str:
        """The local path of a path inside the container."""
        for mount, local in self.mounts.items():
            if mounted == mount or mounted.startswith(mount + "/"):
                return local + mounted[len(mount):]
        return mounted


class Manifests:
    """The rendered objects, and Secrets the user creates beside them
    (name -> key -> value)."""

    def __init__(self, docs: list[dict], user_secrets: dict[str, dict[str, str]] | None = None):
        self.docs = docs
        self.config_maps = {d["metadata"]["name"]: dict(d.get("data") or {}) for d in docs if d["kind"] == "ConfigMap"}
        self.secrets: dict[str, dict[str, str]] = dict(user_secrets or {})
        for doc in docs:
            if doc["kind"] == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
                data.update(doc.get("stringData") or {})
                self.secrets[doc["metadata"]["name"]] = data

    def workloads(self, kinds=("Deployment", "Job")) -> list[dict]:
        return [d for d in self.docs if d["kind"] in kinds]

    def secret(self, name: str, key: str) -> str:
        try:
            return self.secrets[name][key]
        except KeyError:
            raise Unresolved(f"Secret {name} has no key {key}") from None

    def commands(self, doc: dict, root: str, volumes: dict[str, str] | None = None) -> list[Command]:
        """Each container of the workload `doc`, its files written under
        `root`; `volumes` maps the names of volumes that are neither
        ConfigMaps nor Secrets (a PersistentVolumeClaim) to local dirs."""
        spec = doc["spec"]["template"]["spec"]
        pod = doc["metadata"]["name"] + "-0"
        sources = {v["name"]: v for v in spec.get("volumes", [])}
        commands = []
        for container in spec["containers"]:
            where = f"{doc['kind']} {doc['metadata']['name']} container {container['name']}"
            mounts = {}
            for mount in container.get("volumeMounts", []):
                local = os.path.join(root, container["name"], mount["name"])
                mounts[mount["mountPath"]] = local
                self._write_volume(sources[mount["name"]], local, (volumes or {}))
            env = {}
            for var in container.get("env", []):
                if "value" in var:
                    env[var["name"]] = str(var["value"])
                    continue
                source = var["valueFrom"]
                if "fieldRef" in source:
                    env[var["name"]] = pod
                elif "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    try:
                        env[var["name"]] = self.secret(ref["name"], ref["key"])
                    except Unresolved:
                        if not ref.get("optional"):
                            raise
                else:
                    raise Unresolved(f"{where}: env {var['name']} from {source}")
            command = Command(where, self._binary(container["image"]), [str(a) for a in container.get("args", [])],
                              env, mounts, doc["metadata"].get("labels", {}))
            # Paths inside the container, wherever they are written down.
            command.env = {k: _rewrite(v, mounts) for k, v in env.items()}
            command.args = [_rewrite(a, mounts) for a in command.args]
            for local in mounts.values():
                if os.path.islink(local):
                    continue
                for dirpath, _, files in os.walk(local):
                    for name in files:
                        _rewrite_file(os.path.join(dirpath, name), mounts)
            commands.append(command)
        return commands

    def _binary(self, image: str) -> str:
        name = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        if name not in BINARIES:
            raise Unresolved(f"image {image} is not a toolfleet image")
        return name

    def _write_volume(self, volume: dict, local: str, volumes: dict[str, str]) -> None:
        os.makedirs(local, exist_ok=True)
        if "configMap" in volume or "secret" in volume or "projected" in volume:
            projections = volume["projected"]["sources"] if "projected" in volume else [volume]
            for source in projections:
                if "configMap" in source:
                    ref = source["configMap"]
                    data = self.config_maps.get(ref["name"])
                    if data is None:
                        raise Unresolved(f"no ConfigMap {ref['name']}")
                else:
                    ref = source["secret"]
                    name = ref.get("secretName") or ref.get("name")
                    if name not in self.secrets:
                        raise Unresolved(f"no Secret {name}")
                    data = self.secrets[name]
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise Unresolved(f"{ref} has no key {item['key']}")
                    path = os.path.join(local, item["path"])
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w") as out:
                        out.write(data[item["key"]])
        elif volume["name"] in volumes:
            os.rmdir(local)
            os.symlink(volumes[volume["name"]], local)
        else:
            raise Unresolved(f"volume {volume['name']}: no local stand-in for {volume}")


def _rewrite(text: str, mounts: dict[str, str]) -> str:
    for mount, local in mounts.items():
        text = text.replace(mount + "/", local + "/")
    return text


def _rewrite_file(path: str, mounts: dict[str, str]) -> None:
    with open(path) as f:
        text = f.read()
    rewritten = _rewrite(text, mounts)
    if rewritten != text:
        with open(path, "w") as out:
            out.write(rewritten)
