"""Before any load: is `--model` served by the target?

A model the target does not serve turns a whole stage into thousands of 404s that say
nothing about the server, so the load tester asks first: the listing of its API
(`/api/tags` for Ollama, `/v1/models` for OpenAI), then the other one. An unknown model
stops the run (exit 2) within seconds, naming the model and those served. A target that
lists nothing the load tester can read (no listing route, a listing behind a key it was
not given) is driven anyway, with a warning; so is one that cannot be reached (its stage
then fails with the connection errors as the reason, exit 1, as before this check).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

LISTINGS = {"ollama": ("/api/tags", "/v1/models"), "openai": ("/v1/models", "/api/tags")}
TIMEOUT_S = 5.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Check:
    ok: bool  # drive the target
    served: list[str] = field(default_factory=list)
    source: str | None = None  # the listing read
    message: str | None = None  # why not (ok False), or a warning (ok True)


def _names(path: str, data: object) -> list[str] | None:
    if not isinstance(data, dict):
        return None
    if path == "/api/tags" and isinstance(data.get("models"), list):
        return [str(m.get("name") or m.get("model")) for m in data["models"] if isinstance(m, dict)]
    if path == "/v1/models" and isinstance(data.get("data"), list):
        return [str(m.get("id")) for m in data["data"] if isinstance(m, dict)]
    return None


def same_model(a: str, b: str) -> bool:
    """Ollama's rule: `llama3` is `llama3:latest`."""

    def key(n: str) -> str:
        return n if ":" in n else n + ":latest"

    return key(a) == key(b)


def check(url: str, api: str, model: str, headers: dict[str, str], timeout: float = TIMEOUT_S) -> Check:
    base = url.rstrip("/")
    failures: list[str] = []
    reached = False
    for path in LISTINGS[api]:
        req = urllib.request.Request(base + path, headers={"Accept": "application/json", **headers})
        try:  # straight to the target, as the load itself goes (no proxy from the environment)
            with _OPENER.open(req, timeout=timeout) as r:
                names = _names(path, json.load(r))
            reached = True
        except urllib.error.HTTPError as e:
            reached = True
            failures.append(f"{path}: HTTP {e.code}")
            continue
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            failures.append(f"{path}: {getattr(e, 'reason', e)}")
            continue
        except ValueError:
            reached = True
            failures.append(f"{path}: not JSON")
            continue
        if names is None:
            failures.append(f"{path}: not a model listing")
            continue
        if any(same_model(model, n) for n in names):
            return Check(True, names, path)
        return Check(
            False,
            names,
            path,
            f"model {model!r} is not served by {url} (its {path} lists "
            f"{', '.join(sorted(names)) or 'no model'}); pick one with --model",
        )
    if not reached:
        return Check(True, message=f"cannot reach {url} to list its models ({'; '.join(failures)})")
    return Check(
        True,
        message=f"could not read the models {url} serves ({'; '.join(failures)}); "
        f"driving it with model {model!r} unchecked",
    )
