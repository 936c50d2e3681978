"""The chart's NATS users under GitOps: the same render every time, a
password rotated by a NATS reload, and a pool added by a restart.

1. Renders deploy/helm/toolfleet twice with credentials.existingSecret and
   credentials.passwordHashes (hashes made here with bcrypt, as a user
   would): both renders are the same, byte for byte, and carry no
   password.
2. Starts nats-server with JetStream and the rendered users file (the
   Secret <release>-toolfleet-nats-users), a redis-server, the setup step
   as the NATS user `setup`, and a worker of the pool `general`.
3. Rotates the pool's password: renders with its new hash, writes the file
   where the server reads it and reloads the server (`nats-server --signal
   reload=<pid>`, what the official chart's config reloader does when a
   mounted Secret changes): a worker with the new password serves, with no
   restart.
4. Adds a pool, `maps`: its worker, started before the server knows it,
   is refused and waits, as a pod would. A reload does not bring in a new
   account's imports (nats-server 2.15; nats-io/nats-server#8560 is the
   same defect in a cluster), so the server restarts with the new file, as
   a rolling restart of a NATS cluster does: the waiting worker connects
   and serves, and so does the pool that was there.

Usage: reload.py CHART_DIR BIN_DIR
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import bcrypt
import helm_python
import yaml

from pods import free_port, wait_until

NATS_SERVER = os.environ.get("TOOLFLEET_NATS_SERVER") or os.path.join(os.path.dirname(sys.executable), "nats-server")
SECRET = "fleet-credentials"
DEFAULT_POOLS = {"general": ["calculate", "get_current_weather"], "knowledge": ["factual_qa", "trend_analysis"]}
# The new pool serves a tool whose consumer the setup step already made.
MAPS = {"maps": ["calculate"]}


def pool(name: str, tools: list[str]) -> dict:
    return {"name": name, "tools": tools, "replicas": 1, "maxInFlight": 4, "resources": {},
            "autoscaling": {"enabled": False, "minReplicas": 1, "maxReplicas": 2, "targetCPU": 70,
                            "lagThreshold": 8}}


def values(pools: dict[str, list[str]], hashes: dict[str, str]) -> dict:
    return {
        "nats": {"url": "nats://nats:4222", "replicas": 1, "auth": "users",
                 "tls": {"secretName": "", "clientCert": False}},
        "credentials": {"existingSecret": SECRET, "passwordHashes": {"nats": hashes, "redis": {}}},
        "pools": [pool(name, tools) for name, tools in pools.items()],
    }


def users_file(chart, pools: dict[str, list[str]], hashes: dict[str, str]) -> tuple[str, str]:
    """The whole render (for comparing renders) and the NATS users file."""
    rendered = chart.render(values(pools, hashes), name="tf", namespace="toolfleet", is_install=True)
    text = "".join(t for p, t in sorted(rendered.items()) if not p.endswith("NOTES.txt"))
    docs = [d for d in yaml.safe_load_all(text) if d]
    [secret] = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-nats-users")]
    return text, secret["stringData"]["toolfleet-users.conf"]


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def main() -> int:
    chart_dir, bin_dir = sys.argv[1:3]
    chart = helm_python.Chart.load(chart_dir)
    users = ["setup", "orchestrator", *(f"pool-{p}" for p in [*DEFAULT_POOLS, *MAPS])]
    passwords = {user: f"{user}-{os.urandom(12).hex()}" for user in users}
    # Cost 4: the lowest bcrypt allows, so the test spends no time on it.
    hashes = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode() for u, p in passwords.items()}
    before = {u: h for u, h in hashes.items() if u != "pool-maps"}
    failures = []

    first, conf = users_file(chart, DEFAULT_POOLS, before)
    again, _ = users_file(chart, DEFAULT_POOLS, before)
    if first != again:
        failures.append("two renders of the same values differ")
    if any(p in first for p in passwords.values()):
        failures.append("a password is in the rendered manifests")

    root = tempfile.mkdtemp(prefix="toolfleet-reload-")
    processes: list[tuple[str, subprocess.Popen]] = []

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(os.path.join(root, f"{name}.log"), "w")
        process = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", ""), **(env or {})},
                                   stdout=log, stderr=subprocess.STDOUT)
        processes.append((name, process))
        return process

    nats_port, redis_port = free_port(), free_port()
    nats_url = f"nats://127.0.0.1:{nats_port}"

    def service_env(user: str) -> dict[str, str]:
        env = {"TOOLFLEET_NATS__URL": nats_url, "TOOLFLEET_NATS__USER": user,
               "TOOLFLEET_NATS__PASSWORD": passwords[user], "TOOLFLEET_NATS__INBOX_PREFIX": f"_INBOX.{user}",
               "TOOLFLEET_NATS__CREATE_MISSING": "false", "TOOLFLEET_NATS__REPLICAS": "1",
               "TOOLFLEET_REDIS__URL": f"redis://127.0.0.1:{redis_port}/"}
        if user.startswith("pool-"):
            env["TOOLFLEET_NATS__API_PREFIX"] = "JS.toolfleet.API"
        return env

    def worker(pool_name: str, tools: list[str], run: str = "") -> str:
        user = f"pool-{pool_name}"
        name = f"{user}{run}"
        start(name, [os.path.join(bin_dir, "toolfleet-worker"), "--tools", ",".join(tools),
                     "--worker-id", name], service_env(user))
        return os.path.join(root, f"{name}.log")

    try:
        users_path = os.path.join(root, "toolfleet-users.conf")
        with open(users_path, "w") as f:
            f.write(conf)
        server_conf = os.path.join(root, "nats.conf")
        with open(server_conf, "w") as f:
            f.write(f'listen: "127.0.0.1:{nats_port}"\njetstream {{ store_dir: "{root}/js" }}\n'
                    f'include "toolfleet-users.conf"\n')
        nats = start("nats-server", [NATS_SERVER, "-c", server_conf, "-l", os.path.join(root, "nats-server.log")])
        start("redis-server", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""])
        wait_until("NATS", lambda: socket.create_connection(("127.0.0.1", nats_port)).close() is None)
        setup = subprocess.run([os.path.join(bin_dir, "toolfleet-orchestrator"), "setup", "--tools",
                                ",".join(sorted({t for tools in DEFAULT_POOLS.values() for t in tools}))],
                               env={"PATH": os.environ.get("PATH", ""), **service_env("setup")},
                               capture_output=True, text=True, timeout=120)
        if setup.returncode != 0:
            raise RuntimeError(f"setup failed: {setup.stdout}{setup.stderr}")
        general = worker("general", DEFAULT_POOLS["general"])
        wait_until("the general pool's worker", lambda: "worker ready" in read(general))

        # A rotated password, by a reload.
        passwords["pool-general"] += "-rotated"
        hashes["pool-general"] = bcrypt.hashpw(passwords["pool-general"].encode(), bcrypt.gensalt(rounds=4)).decode()
        before["pool-general"] = hashes["pool-general"]
        _, rotated = users_file(chart, DEFAULT_POOLS, before)
        with open(users_path, "w") as f:
            f.write(rotated)
        reload = subprocess.run([NATS_SERVER, "--signal", f"reload={nats.pid}"], capture_output=True, text=True)
        if reload.returncode != 0:
            raise RuntimeError(f"reload: {reload.stderr}")
        wait_until("the reload", lambda: "Reloaded server configuration" in read(os.path.join(root, "nats-server.log")))
        general = worker("general", DEFAULT_POOLS["general"], "rotated")
        wait_until("a worker with the rotated password", lambda: "worker ready" in read(general))

        # A new pool: refused until the server restarts with it.
        _, more = users_file(chart, {**DEFAULT_POOLS, **MAPS}, hashes)
        maps = worker("maps", MAPS["maps"])
        wait_until("NATS to refuse the maps pool", lambda: "authorization" in read(maps).lower())
        with open(users_path, "w") as f:
            f.write(more)
        nats.send_signal(signal.SIGTERM)
        nats.wait(timeout=30)
        start("nats-server-again", [NATS_SERVER, "-c", server_conf, "-l", os.path.join(root, "nats-server.log")])
        wait_until("the maps pool's worker after the restart", lambda: "worker ready" in read(maps), 60)
        wait_until("the general pool's worker after the restart",
                 lambda: read(general).count("connected successfully") >= 2, 60)
        print(f"reload: {len(users)} users rendered the same twice, a password rotated by a reload, "
              "a pool added by a restart")
    except Exception as err:  # noqa: BLE001 - reported with the logs
        failures.append(f"{type(err).__name__}: {err}")
    for _, process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
    if failures:
        for name in sorted(os.listdir(root)):
            if name.endswith(".log"):
                print(f"--- {name}\n{read(os.path.join(root, name))[-3000:]}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
