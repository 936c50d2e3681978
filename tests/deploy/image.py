"""toolfleet's images as deploy/Dockerfile builds them, read without a
container engine: what each target stage puts in a container's
environment (ENV), which files it copies from the repository (COPY without
--from), and what it runs (ENTRYPOINT). A container runtime starts a
container with the image's environment, then the pod's or compose file's
on top (those win for the same name); the checks run the binaries the
same way, so a setting the image bakes in cannot go unseen.
"""

import json
import os
import shlex
from dataclasses import dataclass, field

# Each image, by the last part of its name, and its Dockerfile target.
TARGETS = {"toolfleet-orchestrator": "orchestrator", "toolfleet-worker": "worker"}


@dataclass
class Image:
    """One target stage of the Dockerfile."""

    env: dict[str, str] = field(default_factory=dict)
    # Path in the image -> the repository file copied there.
    files: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)

    def local(self, path: str) -> str:
        """The repository file standing for `path` in the image, if the
        image holds one there, else `path`."""
        return self.files.get(path, path)


def read(dockerfile: str) -> dict[str, Image]:
    """Every named stage of `dockerfile` (in the repository's deploy/)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(dockerfile)))
    images: dict[str, Image] = {}
    stage = None
    with open(dockerfile) as f:
        text = f.read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction not in ("FROM", "ENV", "COPY", "ENTRYPOINT"):
            continue
        args = shlex.split(rest)
        if instruction == "FROM":
            stage = Image() if len(args) >= 3 and args[-2].upper() == "AS" else None
            if stage is not None:
                images[args[-1]] = stage
        elif stage is None:
            continue
        elif instruction == "ENV":
            if len(args) == 2 and "=" not in args[0]:
                stage.env[args[0]] = args[1]  # the legacy form: ENV KEY value
            else:
                stage.env.update(arg.partition("=")[::2] for arg in args)
        elif instruction == "COPY" and not any(a.startswith("--from") for a in args):
            *sources, dest = [a for a in args if not a.startswith("--")]
            for source in sources:
                target = os.path.join(dest, os.path.basename(source)) if dest.endswith("/") else dest
                stage.files[target] = os.path.join(root, source)
        elif instruction == "ENTRYPOINT":
            stage.entrypoint = json.loads(rest)
    return images


def of(image: str, images: dict[str, Image]) -> Image | None:
    """The stage an image reference (`registry/toolfleet-worker:0.1.0`)
    was built from, if it is one of toolfleet's."""
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    target = TARGETS.get(name)
    return images.get(target) if target else None
