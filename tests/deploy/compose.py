"""Checks deploy/docker-compose.yml against the binaries it runs, without
Docker: every toolfleet service's command, with the environment the image
and the compose file give it, is run by the workspace's own binary.

- the one-off `setup` runs for real against the test NATS server (its URL
  rewritten) and must create what it names;
- every long-running service's command must load (`--print-config`), and
  the printed configuration must say what the compose file meant, with
  the image's environment and files applied first (image.py): every
  published port is one the service listens on;
- the tools the workers serve are exactly those whose consumers the setup
  creates (the services may not create them; a tool missing from either
  side would leave its calls unserved);
- every healthcheck must name a subcommand the binary has.

Usage: compose.py COMPOSE_FILE DOCKERFILE BIN_DIR NATS_URL
"""

import sys

import yaml

import image
from common import Checks, listen_ports

TARGETS = {"orchestrator": "toolfleet-orchestrator", "worker": "toolfleet-worker"}


def target_of(service: dict, services: dict) -> str | None:
    """The Dockerfile target of a service's image (built by it or another)."""
    name = service.get("image", "")
    for other in services.values():
        build = other.get("build")
        if build and other.get("image") == name:
            return build.get("target")
    return None


def main() -> int:
    compose_file, dockerfile, bin_dir, nats_url = sys.argv[1:5]
    services = yaml.safe_load(open(compose_file))["services"]
    stages = image.read(dockerfile)
    checks = Checks(bin_dir, nats_url)
    for name, service in services.items():
        target = target_of(service, services)
        if target is None:
            continue  # nats, redis: not ours
        binary = TARGETS[target]
        built = stages[target]
        env = {**built.env, **{k: str(v) for k, v in service.get("environment", {}).items()}}
        # A path the image holds is its file in the repository here.
        env = {k: built.local(v) for k, v in env.items()}
        args = [str(a) for a in service.get("command", [])]
        if args[:1] == ["setup"]:
            checks.setup(name, binary, args, env)
        else:
            config = checks.service(name, binary, args, env)
            published = {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}
            if config is not None and not published <= listen_ports(config):
                checks.failures.append(f"{name}: publishes {sorted(published)}, "
                                       f"listens on {sorted(listen_ports(config))}")
        health = service.get("healthcheck", {}).get("test")
        if health:
            checks.probe(name, binary, [str(a) for a in health[1:]])
    return checks.finish("compose", 4)


if __name__ == "__main__":
    sys.exit(main())
