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

import sys

import yaml

from common import Checks

TARGETS = {"orchestrator": "toolfleet-orchestrator", "worker": "toolfleet-worker"}


def image_env(dockerfile: str) -> dict[str, dict[str, str]]:
    """The ENV of each named stage of the Dockerfile."""
    envs: dict[str, dict[str, str]] = {}
    stage = None
    for line in open(dockerfile).read().replace("\\\n", " ").splitlines():
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


def main() -> int:
    compose_file, dockerfile, bin_dir, nats_url = sys.argv[1:5]
    services = yaml.safe_load(open(compose_file))["services"]
    stages = image_env(dockerfile)
    checks = Checks(bin_dir, nats_url)
    for name, service in services.items():
        target = target_of(service, services)
        if target is None:
            continue  # nats, redis: not ours
        binary = TARGETS[target]
        env = {**stages[target], **{k: str(v) for k, v in service.get("environment", {}).items()}}
        args = [str(a) for a in service.get("command", [])]
        if args[:1] == ["setup"]:
            checks.setup(name, binary, args, env)
        else:
            checks.service(name, binary, args, env)
        health = service.get("healthcheck", {}).get("test")
        if health:
            checks.probe(name, binary, [str(a) for a in health[1:]])
    return checks.finish("compose", 4)


if __name__ == "__main__":
    sys.exit(main())
