"""docker-compose.yml, checked without a container engine: the `ray` profile (docs/scale.md) wires a
Ray head that runs the service and workers that join it, from the CPU image that carries ray; every
softknn command the file runs parses with this CLI; scripts/check_docker.sh validates every profile."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer.main
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _shell(service: str) -> str:
    s = SERVICES[service]
    assert s["entrypoint"] == ["/bin/sh", "-c"] and len(s["command"]) == 1
    return s["command"][0]


def _defaults(text: str) -> str:
    """text with compose's `${VAR:-default}` replaced by its default (what `up` runs with VAR unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def _exec_argv(service: str) -> list[str]:
    """The argv the container's shell finally execs (`... && exec PROGRAM ARGS`), compose's defaults in."""
    script = _shell(service)
    return shlex.split(_defaults(script.rsplit("exec ", 1)[1]))


def _profiles() -> set[str]:
    return {p for s in SERVICES.values() for p in s.get("profiles", [])}


def test_the_ray_profile_is_a_head_running_the_service_and_workers_joining_it():
    head, worker = SERVICES["ray-head"], SERVICES["ray-worker"]
    assert head["profiles"] == ["ray"] and worker["profiles"] == ["ray"]  # a plain `up` starts neither
    for s in (head, worker):  # the CPU image, the same one `service` runs
        assert s["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
        assert s["image"] == SERVICES["service"]["image"] == "softknn:${SOFTKNN_TAG:-0.1.0}"
        assert s["volumes"] == ["bundles:/bundles:ro"]  # the bundle at the same path on every node
        assert s["secrets"] == ["ray_auth_token"] and s["shm_size"] == "${RAY_SHM_SIZE:-2gb}"
        assert s["environment"] == SERVICES["service"]["environment"]  # the same SOFTKNN_* settings
        assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/run/secrets/ray_auth_token &&" in _shell(
            "ray-head" if s is head else "ray-worker")

    start = re.search(r"ray start --head --port (\d+) --include-dashboard false --disable-usage-stats &&",
                      _shell("ray-head"))
    assert start, _shell("ray-head")
    gcs = f"{head['hostname']}:{start.group(1)}"
    assert gcs == "ray-head:6379"
    # the service on the head joins that cluster; the worker joins the same address and blocks
    # (on the sharded bundle the profile's builder writes, once the head and 2 workers are up)
    assert _exec_argv("ray-head") == ["softknn", "serve", "--bundle", "/bundles/sharded", "--ray", "--address", gcs,
                                      "--wait-nodes", "3", "--host", "0.0.0.0", "--port", "8000"]
    assert _exec_argv("ray-worker") == ["ray", "start", "--address", gcs, "--block", "--disable-usage-stats"]
    assert head["depends_on"] == {"ray-builder": {"condition": "service_completed_successfully"}}
    builder = SERVICES["ray-builder"]
    assert builder["profiles"] == ["ray"] and builder["network_mode"] == "none"
    assert [_defaults(x) for x in builder["command"]] == ["build", "/kb", "--out", "/bundles/sharded", "--shards", "2",
                                                           "--force", "--no-progress"]
    assert builder["volumes"] == SERVICES["builder"]["volumes"]
    assert worker["depends_on"] == {"ray-head": {"condition": "service_started"}}
    assert head["ports"] == ["${SOFTKNN_RAY_PUBLISH:-127.0.0.1:8002}:8000"]  # loopback unless told otherwise
    assert "ports" not in worker  # Ray's own ports stay on the compose network
    assert head["healthcheck"] == SERVICES["service"]["healthcheck"]
    assert COMPOSE["secrets"] == {"ray_auth_token": {"file": "${RAY_AUTH_TOKEN_FILE:-./.ray_auth_token}"}}
    for ignore in (".gitignore", ".dockerignore"):  # the secret is never committed nor sent to a build
        assert {"/.ray_auth_token", ".ray_auth_token"} & set((REPO / ignore).read_text().splitlines())


def test_a_container_without_a_readable_token_stops_with_a_message(tmp_path):
    """The guard at the start of both containers' scripts, run by a real shell on a missing file."""
    for service in ("ray-head", "ray-worker"):
        guard = _shell(service).split("};", 1)[0] + "}"  # the first statement: test ... || { echo ...; exit 2; }
        guard = guard.replace("/run/secrets/ray_auth_token", str(tmp_path / "token"))
        r = subprocess.run(["/bin/sh", "-c", guard + "; echo started"], capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == f"{service}: no readable Ray token: write ./.ray_auth_token (docs/scale.md)\n"
        (tmp_path / "token").write_text("0123abcd\n")
        r = subprocess.run(["/bin/sh", "-c", guard + "; echo started"], capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout) == (0, "started\n")
        (tmp_path / "token").unlink()


def _parses(argv: list[str]) -> None:
    """argv (after `softknn`) through the CLI's own parser: an unknown option or command raises."""
    from softknn.cli import app

    group = typer.main.get_command(app)
    name, *args = argv
    command = group.get_command(group.context_class(group), name)
    assert command is not None, f"softknn has no command {name!r}"
    command.make_context(name, list(args))


def test_every_softknn_command_in_the_compose_file_parses():
    image = SERVICES["service"]["image"]
    commands = [s["command"] for s in SERVICES.values() if s.get("image") == image and "entrypoint" not in s
                and "command" in s]  # the image's ENTRYPOINT is softknn
    assert commands == [["build", "/kb", "--out", "/bundles/current", "--force", "--no-progress"],
                        ["build", "/kb", "--out", "/bundles/sharded", "--shards", "${RAY_SHARDS:-2}", "--force",
                         "--no-progress"]]
    for command in commands:
        _parses([_defaults(x) for x in command])
    _parses(["build", "/kb", "--out", "/bundles/current", "--ray", "--address", "ray-head:6379"])
    with pytest.raises(Exception, match="No such option: --no-such-option"):  # the check can fail
        _parses(["build", "/kb", "--out", "/b", "--no-such-option"])


def test_the_ray_heads_serve_command_parses():
    """`softknn serve --ray --address` is the Ray serving flag, developed on its own branch;
    until it is merged this check says so instead of passing."""
    from softknn.cli import app

    group = typer.main.get_command(app)
    serve = group.get_command(group.context_class(group), "serve")
    if "--ray" not in {o for p in serve.params for o in p.opts}:
        pytest.skip("softknn serve has no --ray option in this tree yet")
    _parses(_exec_argv("ray-head")[1:])


def test_check_docker_validates_every_profile_of_the_compose_file():
    script = (REPO / "scripts" / "check_docker.sh").read_text()
    listed = re.search(r"^PROFILES=\((.*)\)$", script, re.M)
    assert listed and set(listed.group(1).split()) == _profiles() == {"loadtest", "gpu", "ray"}


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) not installed")
@pytest.mark.parametrize("profile", [None, "loadtest", "gpu", "ray"])
def test_docker_compose_config_is_valid_per_profile(profile):
    args = ["docker-compose", "-f", str(REPO / "docker-compose.yml")] + (["--profile", profile] if profile else [])
    r = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert (r.returncode, r.stderr) == (0, "")
    r = subprocess.run([*args, "config", "--services"], capture_output=True, text=True, timeout=120, cwd=REPO)
    # (compose v1 lists every service whatever the profile; the file's own view of them)
    assert r.returncode == 0 and set(r.stdout.split()) == set(SERVICES) >= {"ray-head", "ray-worker"}


def _pins(lock: str) -> dict[str, str]:
    lines = (REPO / "docker" / lock).read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_the_cpu_image_lock_carries_ray_and_no_cuda():
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ray"]
    assert extra == ["ray[serve,data]==2.60.0"]
    pins = {k.lower(): v for k, v in _pins("requirements-cpu.txt").items()}
    assert pins["ray"] == "2.60.0" and pins["torch"] == "2.13.0+cpu"
    assert {"pyarrow", "pandas"} <= set(pins)  # ray[data]'s own dependencies are pinned too
    assert not [n for n in pins if n.startswith(("nvidia-", "triton", "cuda"))]


def test_both_image_locks_carry_the_remote_extra_at_the_versions_pyproject_allows():
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["remote"]
    for lock in ("requirements-cpu.txt", "requirements-gpu.txt"):
        pins = {k.lower(): v for k, v in _pins(lock).items()}
        for dep in map(Requirement, extra):
            assert dep.name in pins, (lock, dep.name)
            assert dep.specifier.contains(pins[dep.name]), (lock, dep.name, pins[dep.name])
        # s3fs releases in step with fsspec: each pins the other's exact calendar version
        assert pins["s3fs"] == pins["fsspec"], lock
