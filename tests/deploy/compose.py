"""Checks deploy/docker-compose.yml against the binaries it runs, without
Docker: every toolfleet service's command, with the environment the image
and the compose file give it, is run by the workspace's own binary.

- the one-off `setup` runs for real against the test NATS server (its URL
  rewritten) and must create what it names;
- every long-running service's command must load (`--print-config`), and
  the printed configuration must say what the compose file meant;
- the tools the workers serve are exactly those whose consumers the setup
  creates (the services may not create them; a tool missing from either
  side would leave its calls unserved);
- every healthcheck must name a subcommand the binary has.

Usage: compose.py COMPOSE_FILE DOCKERFILE BIN_DIR NATS_URL
"""

import json
import os
import subprocess
import sys

import yaml

BINARIES = {"orchestrator": "toolfleet-orchestrator", "worker": "toolfleet-worker"}


def image_env(dockerfile: str) -> dict[str, dict[str, str]]:
    """The ENV of each named stage of the Dockerfile."""
    envs: dict[str, dict[str, str]] = {}
    stage = None
    lines = open(dockerfile).read().replace("\\\n", " ").splitlines()
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] == "FROM":
            stage = words[-1] if "AS" in words else None
            if stage:
                envs[stage] = {}
        elif words[0] == "ENV" and stage:
            for pair in words[1:]:
                key, _, value = pair.partition("=")
                envs[stage][key] = value
    return envs


def target_of(service: dict, services: dict) -> str | None:
    """The Dockerfile target of a service's image (built by it or another)."""
    image = service.get("image", "")
    for other in services.values():
        build = other.get("build")
        if build and other.get("image") == image:
            return build.get("target")
    return None


def run(binary: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {"PATH": os.environ.get("PATH", ""), **env}
    return subprocess.run(
        [binary, *args], env=full_env, capture_output=True, text=True, timeout=60
    )


def main() -> int:
    compose_file, dockerfile, bin_dir, nats_url = sys.argv[1:5]
    compose = yaml.safe_load(open(compose_file))
    services = compose["services"]
    stages = image_env(dockerfile)
    failures = []
    checked = 0
    set_up: set[str] = set()
    served: set[str] = set()
    for name, service in services.items():
        target = target_of(service, services)
        if target is None:
            continue  # nats, redis: not ours
        binary = os.path.join(bin_dir, BINARIES[target])
        env = {**stages[target], **{k: str(v) for k, v in service.get("environment", {}).items()}}
        args = [str(a) for a in service.get("command", [])]
        if args[:1] == ["setup"]:
            env["TOOLFLEET_NATS__URL"] = nats_url
            done = run(binary, args, env)
            made = done.stdout
            tools = args[args.index("--tools") + 1].split(",")
            set_up.update(tools)
            expected = [f"tool_{tool}" for tool in tools]
            if done.returncode != 0 or not all(e in made for e in expected):
                failures.append(f"{name}: setup {args} gave {done.returncode}:\n{made}{done.stderr}")
        else:
            done = run(binary, [*args, "--print-config"], env)
            if done.returncode != 0:
                failures.append(f"{name}: {args} does not load:\n{done.stderr}")
            else:
                config = json.loads(done.stdout)
                if "--tools" in args:
                    tools = args[args.index("--tools") + 1].split(",")
                    if config.get("tools") != tools:
                        failures.append(f"{name}: serves {config.get('tools')}, not {tools}")
                    served.update(tools)
                if config["nats"]["create_missing"] is not False:
                    failures.append(f"{name}: would create JetStream objects itself")
                if config["log"]["format"] != "json":
                    failures.append(f"{name}: logs are not JSON")
        health = service.get("healthcheck", {}).get("test")
        if health:
            probe = [str(a) for a in health[1:]]
            if os.path.basename(probe[0]) != BINARIES[target]:
                failures.append(f"{name}: the healthcheck runs {probe[0]}, not its own binary")
            done = run(binary, [*probe[1:], "--help"], env)
            if done.returncode != 0:
                failures.append(f"{name}: healthcheck {probe[1:]} is not a subcommand:\n{done.stderr}")
        checked += 1
    if served != set_up:
        failures.append(
            f"the workers serve {sorted(served)}, the setup creates consumers for {sorted(set_up)}"
        )
    print(f"compose: {checked} toolfleet services checked")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures or checked < 4 else 0


if __name__ == "__main__":
    sys.exit(main())
