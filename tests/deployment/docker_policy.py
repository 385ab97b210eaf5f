"""Documented checks of docker/ that hadolint does not make (or makes only as warnings we want as
errors), written as small functions over file text so tests can feed them bad examples.

Dockerfile rules (each returns a list of human-readable problems; empty means OK)
- ``pinned_base_images``: every ``FROM`` names a tag (after resolving ``ARG`` defaults) that is
  not ``latest`` -- or a digest; ``FROM <earlier stage>`` is fine.
- ``pip_no_cache``: every ``pip install`` has ``--no-cache-dir``.
- ``non_root_user``: every final stage (each stage a compose target may pick) ends with a
  ``USER`` that is not ``root``/``0``.
- ``healthcheck_present``: each stage has a ``HEALTHCHECK`` (compose adds its own too).
- ``no_secret_env``: no ``ENV``/``ARG`` whose name looks like a secret (password, secret,
  token, api key, private key) carries a value.

Compose rules, over the parsed ``docker compose config`` model
- ``compose_services_ok``: every service has a health check and a restart policy, no image
  tagged ``latest`` or untagged, and no secret-looking ``environment`` entry with a literal value
  (secrets come from the env file).
"""

from __future__ import annotations

import re
import shlex

SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|PRIVATE_?KEY)", re.IGNORECASE)


def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def _instructions(text: str) -> list[tuple[str, str]]:
    out = []
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _stages(text: str) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions(text):
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _global_args(text: str) -> dict[str, str]:
    args: dict[str, str] = {}
    for keyword, rest in _instructions(text):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip().strip('"')
    return args


def pinned_base_images(text: str) -> list[str]:
    problems = []
    args = _global_args(text)
    stage_names: set[str] = set()
    for keyword, rest in _instructions(text):
        if keyword != "FROM":
            continue
        words = [w for w in rest.split() if not w.startswith("--")]
        image = words[0]
        earlier_stage = image.lower() in stage_names
        if len(words) >= 3 and words[1].upper() == "AS":
            stage_names.add(words[2].lower())
        if earlier_stage:
            continue
        resolved = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if "$" in resolved:
            problems.append(f"FROM {image}: the tag comes from an ARG without a default")
            continue
        if "@sha256:" in resolved:
            continue
        name_part = resolved.rsplit("/", 1)[-1]
        if ":" not in name_part:
            problems.append(f"FROM {image}: no tag (pin a version)")
        elif name_part.rsplit(":", 1)[1].lower() == "latest":
            problems.append(f"FROM {image}: 'latest' is not a pinned version")
    return problems


def pip_no_cache(text: str) -> list[str]:
    problems = []
    for keyword, rest in _instructions(text):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", rest):
            words = command.split()
            for i, word in enumerate(words[:-1]):
                if re.fullmatch(r"(.*/)?pip3?(\.\d+)?", word) and words[i + 1] == "install":
                    if "--no-cache-dir" not in words[i + 2 :]:
                        problems.append(
                            f"RUN {command.strip()}: pip install without --no-cache-dir"
                        )
    return problems


def non_root_user(text: str) -> list[str]:
    problems = []
    for index, stage in enumerate(_stages(text)):
        users = [rest for keyword, rest in stage if keyword == "USER"]
        header = stage[0][1]
        if not users:
            problems.append(f"stage {index} ({header}): no USER (runs as the base image's user)")
            continue
        user = users[-1].split(":")[0].strip()
        if user in ("root", "0"):
            problems.append(f"stage {index} ({header}): ends as root (USER {users[-1]})")
    return problems


def healthcheck_present(text: str) -> list[str]:
    problems = []
    for index, stage in enumerate(_stages(text)):
        checks = [rest for keyword, rest in stage if keyword == "HEALTHCHECK"]
        if not checks or checks[-1].upper().startswith("NONE"):
            problems.append(f"stage {index} ({stage[0][1]}): no HEALTHCHECK")
    return problems


def no_secret_env(text: str) -> list[str]:
    problems = []
    for keyword, rest in _instructions(text):
        if keyword not in ("ENV", "ARG"):
            continue
        try:
            words = shlex.split(rest)
        except ValueError:
            words = rest.split()
        pairs = []
        if keyword == "ENV" and len(words) == 2 and "=" not in words[0]:
            pairs = [(words[0], words[1])]  # legacy "ENV KEY value"
        else:
            for word in words:
                name, sep, value = word.partition("=")
                pairs.append((name, value if sep else ""))
        for name, value in pairs:
            if SECRET_NAME.search(name) and value:
                problems.append(f"{keyword} {name}: a secret must not be baked into the image")
    return problems


DOCKERFILE_RULES = (
    pinned_base_images,
    pip_no_cache,
    non_root_user,
    healthcheck_present,
    no_secret_env,
)


def check_dockerfile(text: str) -> list[str]:
    return [problem for rule in DOCKERFILE_RULES for problem in rule(text)]


def compose_services_ok(model: dict) -> list[str]:
    """Problems in a parsed compose model (``docker compose config --format json``)."""
    problems = []
    for name, service in (model.get("services") or {}).items():
        check = service.get("healthcheck")
        if not check or check.get("disable") or check.get("test") in (None, [], ["NONE"]):
            problems.append(f"service {name}: no healthcheck")
        if service.get("restart") in (None, "", "no"):
            problems.append(f"service {name}: no restart policy")
        image = service.get("image")
        if image:
            tail = image.rsplit("/", 1)[-1]
            if "@sha256:" not in image and (":" not in tail or tail.endswith(":latest")):
                problems.append(f"service {name}: image {image} is not pinned to a version")
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.partition("=")[::2] for item in environment)
        for key, value in environment.items():
            if SECRET_NAME.search(key) and value and not str(value).startswith("/"):
                problems.append(
                    f"service {name}: environment {key} has a literal value; put secrets in .env"
                )
    return problems
