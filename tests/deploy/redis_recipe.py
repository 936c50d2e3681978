"""Checks deploy/recipes/redis-values.yaml against Bitnami's Redis chart,
where that chart is at hand (the test machines reach no Helm repository,
so the test suite cannot run this; run it by hand with the chart unpacked,
its `common` dependency under charts/):

- the chart renders with the recipe; the primary's and the replicas'
  configuration includes toolfleet's users file, which their pods mount
  from the Secret the toolfleet chart makes in the Redis namespace
  (redis.usersNamespace);
- redis-server, started with the rendered primary configuration, the
  rendered users file (redis.defaultUser: keep) and the chart's own
  password for `default`, lets the orchestrator's user in with its
  password, keeps `default` for the chart's probes, and refuses a pool's
  user the job keys.

Usage: redis_recipe.py REDIS_CHART_DIR TOOLFLEET_CHART_DIR
"""

import base64
import os
import socket
import subprocess
import sys
import tempfile
import time

import helm_python
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "deploy", "recipes", "redis-values.yaml")


def render(chart_dir: str, values: dict, name: str, namespace: str) -> list[dict]:
    rendered = helm_python.Chart.load(chart_dir).render(values, name=name, namespace=namespace, is_install=True)
    return [d for p, t in sorted(rendered.items()) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def redis_cli(port: int, user: str, password: str, *command: str) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), "--user", user, "--pass", password, "--no-auth-warning",
                           *command], capture_output=True, text=True, timeout=10)
    return (done.stdout + done.stderr).strip()


def main() -> int:
    redis_chart, toolfleet_chart = sys.argv[1:3]
    with open(RECIPE) as f:
        recipe = yaml.safe_load(f)
    redis = render(redis_chart, recipe, "redis", "cache")
    toolfleet = render(toolfleet_chart, {"redis": {"url": "redis://redis-master.cache.svc:6379/", "waitReplicas": 1,
                                                   "usersNamespace": "cache", "defaultUser": "keep"}},
                       "tf", "toolfleet")
    failures = []
    secrets = {d["metadata"]["name"]: d for d in toolfleet if d["kind"] == "Secret"}
    users = secrets["tf-toolfleet-redis-users"]
    if users["metadata"].get("namespace") != "cache":
        failures.append(f"the users Secret is made in {users['metadata'].get('namespace')}, not Redis's namespace")
    passwords = {k: base64.b64decode(v).decode() for k, v in secrets["tf-toolfleet-credentials"]["data"].items()}
    [config] = [d for d in redis if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-configuration")]
    include = "include /etc/toolfleet/redis/toolfleet-users.conf"
    if include not in config["data"]["redis.conf"]:
        failures.append("redis.conf does not include toolfleet's users file")
    for server in (d for d in redis if d["kind"] == "StatefulSet"):
        spec = server["spec"]["template"]["spec"]
        volume = next((v for v in spec.get("volumes", []) if v["name"] == "toolfleet-users"), None)
        mounted = any(m["name"] == "toolfleet-users" for m in spec["containers"][0].get("volumeMounts", []))
        if (volume or {}).get("secret", {}).get("secretName") != users["metadata"]["name"] or not mounted:
            failures.append(f"{server['metadata']['name']} does not mount the users file")
    with tempfile.TemporaryDirectory() as root:
        users_file = os.path.join(root, "toolfleet-users.conf")
        with open(users_file, "w") as f:
            f.write(users["stringData"]["toolfleet-users.conf"])
        conf = os.path.join(root, "redis.conf")
        with open(conf, "w") as f:
            f.write(config["data"]["redis.conf"].replace("/etc/toolfleet/redis/toolfleet-users.conf", users_file))
            f.write("\n" + config["data"]["master.conf"].replace("dir /data", f"dir {root}") + "\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(["redis-server", conf, "--port", str(port), "--bind", "127.0.0.1",
                                   "--requirepass", "the-charts-own"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            checks = {
                ("orchestrator", passwords["redis-orchestrator"], "PING"): "PONG",
                ("default", "the-charts-own", "PING"): "PONG",
                ("pool-general", passwords["redis-pool-general"], "GET", "tf:{job-x}:job"): "NOPERM",
            }
            for (user, password, *command), want in checks.items():
                got = redis_cli(port, user, password, *command)
                if want not in got:
                    failures.append(f"{user} {' '.join(command)}: {got!r}, not {want}")
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(f"redis recipe: {len(redis)} objects of Bitnami's chart; toolfleet's users and the chart's default "
          "user both log in" if not failures else "redis recipe: FAILED")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
