"""Checks deploy/recipes/nats-values.yaml against the official NATS chart,
where that chart is at hand (the test machines reach no Helm repository,
so the test suite cannot run this; run it by hand with the chart unpacked,
e.g. `helm pull nats/nats --untar`):

- the chart renders with the recipe; its nats.conf includes toolfleet's
  users file, which the nats container and the config reloader both mount
  from the Secret the toolfleet chart makes in the NATS namespace
  (nats.usersNamespace);
- the headless Service carries the monitoring port KEDA reads;
- the rendered nats.conf, with the rendered users file where the pod
  mounts it, is a configuration nats-server accepts (`nats-server -t`).

Usage: nats_recipe.py NATS_CHART_DIR TOOLFLEET_CHART_DIR
"""

import os
import subprocess
import sys
import tempfile

import helm_python
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "deploy", "recipes", "nats-values.yaml")
NATS_SERVER = os.environ.get("TOOLFLEET_NATS_SERVER") or os.path.join(os.path.dirname(sys.executable), "nats-server")


def render(chart_dir: str, values: dict, name: str, namespace: str) -> list[dict]:
    rendered = helm_python.Chart.load(chart_dir).render(values, name=name, namespace=namespace, is_install=True)
    return [d for p, t in sorted(rendered.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def main() -> int:
    nats_chart, toolfleet_chart = sys.argv[1:3]
    with open(RECIPE) as f:
        recipe = yaml.safe_load(f)
    nats = render(nats_chart, recipe, "nats", "messaging")
    toolfleet = render(toolfleet_chart, {"nats": {"url": "nats://nats-headless.messaging.svc:4222",
                                                  "usersNamespace": "messaging", "replicas": 3, "auth": "users",
                                                  "tls": {"secretName": "", "clientCert": False}}},
                       "tf", "toolfleet")
    failures = []
    [users] = [d for d in toolfleet if d["kind"] == "Secret" and d["metadata"]["name"] == "tf-toolfleet-nats-users"]
    if users["metadata"].get("namespace") != "messaging":
        failures.append(f"the users Secret is made in {users['metadata'].get('namespace')}, not NATS's namespace")
    [config] = [d for d in nats if d["kind"] == "ConfigMap"]
    conf = config["data"]["nats.conf"]
    if "include ./toolfleet/toolfleet-users.conf;" not in conf:
        failures.append("nats.conf does not include toolfleet's users file")
    [server] = [d for d in nats if d["kind"] == "StatefulSet"]
    spec = server["spec"]["template"]["spec"]
    volume = next((v for v in spec["volumes"] if v["name"] == "toolfleet-users"), None)
    if (volume or {}).get("secret", {}).get("secretName") != users["metadata"]["name"]:
        failures.append(f"no volume from the users Secret: {volume}")
    for container in spec["containers"]:
        if container["name"] in ("nats", "reloader") and not any(
                m["name"] == "toolfleet-users" and m["mountPath"] == "/etc/nats-config/toolfleet"
                for m in container.get("volumeMounts", [])):
            failures.append(f"the {container['name']} container does not mount the users file")
    [headless] = [d for d in nats if d["kind"] == "Service" and d["metadata"]["name"].endswith("-headless")]
    if 8222 not in [p["port"] for p in headless["spec"]["ports"]]:
        failures.append("the headless Service has no monitoring port")
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "toolfleet"))
        with open(os.path.join(root, "toolfleet", "toolfleet-users.conf"), "w") as f:
            f.write(users["stringData"]["toolfleet-users.conf"])
        local = conf.replace('"/data"', f'"{root}/data"').replace("/var/run/nats/nats.pid", f"{root}/nats.pid")
        with open(os.path.join(root, "nats.conf"), "w") as f:
            f.write(local)
        checked = subprocess.run([NATS_SERVER, "-c", os.path.join(root, "nats.conf"), "-t"],
                                 env={**os.environ, "SERVER_NAME": "nats-0"}, capture_output=True, text=True)
        if checked.returncode != 0:
            failures.append(f"nats-server refuses the configuration: {checked.stderr}")
    print(f"nats recipe: {len(nats)} objects of the official chart, configuration accepted by nats-server"
          if not failures else "nats recipe: FAILED")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
