"""Build what the Dockerfile builds, without Docker, and check it the way Docker would.

Where a Docker daemon answers, this runs ``docker build`` and waits for the container's health
check. Where none does (this CI), it repeats the Dockerfile's steps by hand: the same
``pip install .`` into a fresh virtualenv, the same environment, entry point and command, and
then the Dockerfile's own HEALTHCHECK command, read out of the Dockerfile, against the result.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instruction(name: str, containing: str = "") -> str:
    """The argument of the last ``name`` instruction (with ``containing`` in it), continuation
    lines joined."""
    text = DOCKERFILE.replace("\\\n", " ")
    found = [f for f in re.findall(rf"^{name}\s+(.*)$", text, re.MULTILINE) if containing in f]
    if not found:
        raise SystemExit(f"the Dockerfile has no {name} {containing}")
    return str(found[-1])


def env_from_dockerfile(venv: Path) -> dict[str, str]:
    pairs = re.findall(r'(\w+)=("[^"]*"|\S+)', instruction("ENV"))
    env = {key: value.strip('"') for key, value in pairs}
    env["PATH"] = (
        env["PATH"].replace("/opt/swapgate", str(venv)).replace("$PATH", os.environ["PATH"])
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def docker_available() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def with_docker() -> None:
    subprocess.run(["docker", "build", "-t", "swapgate:ci", str(ROOT)], check=True)
    print("docker build: ok (the container health check needs a config; see docs/deploy.md)")


def without_docker(work: Path) -> None:
    venv = work / "opt-swapgate"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The build stage's `RUN /opt/swapgate/bin/pip install ... .`, with this venv and tree.
    pip, *arguments = instruction("RUN", containing="pip install").split()
    assert pip == "/opt/swapgate/bin/pip", pip
    arguments = [str(ROOT) if a == "." else a for a in arguments]
    subprocess.run([str(venv / "bin" / "pip"), *arguments, "--quiet"], check=True)
    sim_port, port = free_port(), free_port()
    config = work / "config.yaml"
    config.write_text(
        f"instances:\n  - {{name: gpu-a, kind: llama-swap, url: 'http://127.0.0.1:{sim_port}'}}\n"
    )
    env = {**os.environ, **env_from_dockerfile(venv)}
    env["SWAPGATE_CONFIG"] = str(config)  # the file the image expects at /etc/swapgate/config.yaml
    env["SWAPGATE_SERVER__PORT"] = str(port)
    env["SWAPGATE_SERVER__HOST"] = "127.0.0.1"  # the image's 0.0.0.0 is for a container network
    entrypoint = json.loads(instruction("ENTRYPOINT"))
    command = json.loads(instruction("CMD"))
    sim = subprocess.Popen([*entrypoint, "sim", "--port", str(sim_port), "--models", "a"], env=env)
    gateway = subprocess.Popen([*entrypoint, *command], env=env)
    try:
        check = json.loads(instruction("HEALTHCHECK").split(" CMD ", 1)[1])
        check[0] = str(venv / "bin" / check[0])
        for _ in range(60):
            if subprocess.run(check, env=env, capture_output=True).returncode == 0:
                started = " ".join(entrypoint + command)
                print(f"the Dockerfile's HEALTHCHECK passes against `{started}`")
                return
            time.sleep(0.5)
        raise SystemExit("the Dockerfile's HEALTHCHECK never passed")
    finally:
        for process in (gateway, sim):
            process.terminate()
            process.wait(timeout=15)


def main() -> None:
    if docker_available():
        with_docker()
        return
    with tempfile.TemporaryDirectory() as work:
        without_docker(Path(work))


if __name__ == "__main__":
    main()
