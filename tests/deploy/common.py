"""What the deployment checks share: running a toolfleet binary the way a
container would, and the checks every deployment file must pass."""

import json
import os
import re
import subprocess

BINARIES = ("toolfleet-orchestrator", "toolfleet-worker")


def run(binary: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs `binary` with only `env` (and PATH), as a container would."""
    full_env = {"PATH": os.environ.get("PATH", ""), **env}
    return subprocess.run(
        [binary, *args], env=full_env, capture_output=True, text=True, timeout=60
    )


def listen_ports(config: dict) -> set[int]:
    """The ports a service with this configuration (`--print-config`)
    listens on: gRPC (the orchestrator's) and metrics."""
    addresses = [config.get("grpc", {}).get("listen"), config.get("metrics", {}).get("listen")]
    return {int(a.rsplit(":", 1)[1]) for a in addresses if a}


class Checks:
    """Failures found so far, and the tools set up and served."""

    def __init__(self, bin_dir: str, nats_url: str):
        self.bin_dir = bin_dir
        self.nats_url = nats_url
        self.failures: list[str] = []
        self.set_up: set[str] = set()
        self.served: set[str] = set()
        self.checked = 0

    def binary(self, name: str) -> str:
        return os.path.join(self.bin_dir, name)

    def setup(self, where: str, binary: str, args: list[str], env: dict[str, str]) -> None:
        """Runs the setup step for real against the test NATS server; when
        its configuration wants TLS, which the test server does not speak,
        checks that configuration instead (`--print-config`)."""
        env = {**env, "TOOLFLEET_NATS__URL": self.nats_url}
        self.checked += 1
        shown = run(self.binary(binary), [*args, "--print-config"], env)
        if shown.returncode != 0:
            self.failures.append(f"{where}: setup {args} does not load:\n{shown.stderr}")
            return
        config = json.loads(shown.stdout)
        if config["nats"]["tls"]["ca_file"] or config["nats"]["tls"]["required"]:
            self.set_up.update(config["setup"]["tools"])
            return
        done = run(self.binary(binary), args, env)
        # What it set up, as it says: a consumer `tool_<tool>` per tool.
        tools = set(re.findall(r"\btool_([A-Za-z0-9_-]+)", done.stdout))
        self.set_up.update(tools)
        if done.returncode != 0 or not tools:
            self.failures.append(
                f"{where}: setup {args} gave {done.returncode}:\n{done.stdout}{done.stderr}"
            )

    def service(self, where: str, binary: str, args: list[str], env: dict[str, str]) -> dict | None:
        """Loads a long-running service's configuration (`--print-config`):
        it must load, log JSON and leave JetStream objects to the setup."""
        done = run(self.binary(binary), [*args, "--print-config"], env)
        self.checked += 1
        if done.returncode != 0:
            self.failures.append(f"{where}: {args} does not load:\n{done.stderr}")
            return None
        config = json.loads(done.stdout)
        if "--tools" in args:
            tools = args[args.index("--tools") + 1].split(",")
            if config.get("tools") != tools:
                self.failures.append(f"{where}: serves {config.get('tools')}, not {tools}")
        if "worker_id" in config:  # toolfleet-worker, or a worker of your own
            self.served.update(config["tools"])
        if config["nats"]["create_missing"] is not False:
            self.failures.append(f"{where}: would create JetStream objects itself")
        if config["log"]["format"] != "json":
            self.failures.append(f"{where}: logs are not JSON")
        return config

    def probe(self, where: str, binary: str, command: list[str]) -> None:
        """A probe must run the container's own binary with one of its
        subcommands."""
        if os.path.basename(command[0]) != binary:
            self.failures.append(f"{where}: the probe runs {command[0]}, not {binary}")
            return
        done = run(self.binary(binary), [*command[1:], "--help"], {})
        if done.returncode != 0:
            self.failures.append(f"{where}: probe {command[1:]} is not a subcommand:\n{done.stderr}")

    def finish(self, what: str, at_least: int) -> int:
        """Reports; the exit code of the check."""
        if self.served != self.set_up:
            self.failures.append(
                f"the workers serve {sorted(self.served)}, "
                f"the setup creates consumers for {sorted(self.set_up)}"
            )
        print(f"{what}: {self.checked} toolfleet containers checked")
        for failure in self.failures:
            print(f"FAIL {failure}")
        return 1 if self.failures or self.checked < at_least else 0


def certificates(root: str) -> dict[str, str]:
    """A CA, and a server's and a client's certificate from it (openssl),
    the server's for 127.0.0.1, where cluster DNS sends the services."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True, timeout=60)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=toolfleet test CA")
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                            ("client", "extendedKeyUsage=clientAuth")):
        with open(os.path.join(root, f"{name}.ext"), "w") as f:
            f.write(extension + "\n")
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext")
    out = {}
    for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key"):
        with open(os.path.join(root, name)) as f:
            out[name] = f.read()
    return out
