"""Runs what rendered Kubernetes manifests configure, without Kubernetes:
each container becomes a local command line with the environment and the
files the kubelet would give it.

A container of toolfleet's images starts with its image's environment
(deploy/Dockerfile's ENV, read by image.py), the container's own `env`
on top, as a container runtime does; files the image holds are the
repository files the Dockerfile copies.

A pod's ConfigMap and Secret volumes are written under a directory of
the test's, and every mount path in the container's environment and in
those files is rewritten to point there. Environment variables from
Secrets and field references resolve as the kubelet would resolve them.
"""

import base64
import os
import re
from dataclasses import dataclass, field

import image as images_of_dockerfile

DOCKERFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "deploy", "Dockerfile")

# What each image runs when a container names no command: toolfleet's own
# (deploy/Dockerfile's targets) and the dev NATS and Redis.
ENTRYPOINTS = {
    "toolfleet-orchestrator": "toolfleet-orchestrator",
    "toolfleet-worker": "toolfleet-worker",
    # A worker of your own: the template's (examples/custom-worker), which
    # the tests build, stands for a user's image.
    "orders-worker": "orders-worker",
    "nats": "nats-server",
    "redis": "redis-server",
}


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

    def __init__(self, docs: list[dict], user_secrets: dict[str, dict[str, str]] | None = None,
                 dockerfile: str = DOCKERFILE):
        self.docs = docs
        self.images = images_of_dockerfile.read(dockerfile)
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

    def commands(self, doc: dict, root: str, volumes: dict[str, str] | None = None,
                 rewrites: dict[str, str] | None = None) -> list[Command]:
        """Each container of the workload `doc`, its files written under
        `root`; `volumes` maps the names of volumes that are neither
        ConfigMaps, Secrets nor emptyDirs (a PersistentVolumeClaim) to local
        dirs; `rewrites` replaces text (an address) wherever mount paths
        are rewritten."""
        spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
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
            built = images_of_dockerfile.of(container["image"], self.images)
            env = dict(built.env) if built else {}
            for var in container.get("env") or []:
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
            entrypoint = [os.path.basename(built.entrypoint[0])] if built and built.entrypoint else None
            argv = [str(a) for a in container.get("command") or entrypoint or [self._entrypoint(container["image"])]]
            argv += [str(a) for a in container.get("args", [])]
            command = Command(where, argv[0], argv[1:], env, mounts, doc["metadata"].get("labels", {}))
            # Paths inside the container, wherever they are written down.
            # A mount path, as a whole path or a prefix of one.
            replace = {re.escape(m) + r"(?=[/\s\"']|$)": local for m, local in mounts.items()}
            # Files the image holds, where no volume covers them.
            for path, local in (built.files.items() if built else ()):
                if command.path(path) == path:
                    replace[re.escape(path) + r"(?=[\s\"']|$)"] = local
            replace.update({re.escape(old): new for old, new in (rewrites or {}).items()})
            command.env = {k: _rewrite(v, replace) for k, v in env.items()}
            command.args = [_rewrite(a, replace) for a in command.args]
            for local in mounts.values():
                if os.path.islink(local):
                    continue
                for dirpath, _, files in os.walk(local):
                    for name in files:
                        _rewrite_file(os.path.join(dirpath, name), replace)
            commands.append(command)
        return commands

    def _entrypoint(self, image: str) -> str:
        name = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        if name not in ENTRYPOINTS:
            raise Unresolved(f"image {image}: its entrypoint is unknown")
        return ENTRYPOINTS[name]

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
        elif "emptyDir" in volume:
            pass
        elif volume["name"] in volumes:
            os.rmdir(local)
            os.symlink(volumes[volume["name"]], local)
        else:
            raise Unresolved(f"volume {volume['name']}: no local stand-in for {volume}")


def _rewrite(text: str, replace: dict[str, str]) -> str:
    for pattern, new in replace.items():
        text = re.sub(pattern, lambda _: new, text, flags=re.M)
    return text


def _rewrite_file(path: str, replace: dict[str, str]) -> None:
    with open(path) as f:
        text = f.read()
    rewritten = _rewrite(text, replace)
    if rewritten != text:
        with open(path, "w") as out:
            out.write(rewritten)
