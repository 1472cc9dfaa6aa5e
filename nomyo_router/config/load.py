"""Loading the configuration: a YAML file's mapping, in either form, made into RouterConfig,
with the checks a single key's declaration cannot make (one holder per key, unique names,
what the cache's keys mean together).

Every problem of a file is reported in one run, not the first alone: each check notes what
it finds and the next goes on (`Problems`); msgspec, which stops at its first error, is run
again without each key it refused (so that key takes its default for the rest of the checks)
until it has nothing more to say.
"""

import copy
import re
from typing import Any, cast

import msgspec

from ..config_checks import (
    ConfigError,
    Problems,
    a_type,
    accepted_keys,
    check_key,
    check_url,
    default_name,
    defaults,
    error_path,
    expand_env,
    explain,
    one_holder_per_key,
    refuse_unknown,
    specs,
    split_userinfo,
)
from .backends import EndpointConfig
from .clients import ClientKey
from .router import INPUT_ONLY, RouterConfig
from .yaml_file import read

__all__ = ["CONFIG_ENV", "SUPERVISOR_ENV", "load_config", "parse_config"]

CONFIG_ENV = "NOMYO_ROUTER_CONFIG"  # the config path, handed from `nomyo-router` to its workers
SUPERVISOR_ENV = "NOMYO_ROUTER_SUPERVISOR_PID"  # set by the CLI with several workers: POST /admin/reload signals it
_RESERVED = {"default", "admin", "metrics"}  # the client names of router_api_key, admin_key, metrics_key
_KEY_SETTINGS = ("router_api_key", "admin_key", "metrics_key")


MAX_ROUNDS = 100  # msgspec runs at most this often on one file (each run finds one problem)
_REQUIRED = ("url", "name", "key")  # an entry of endpoints or client_keys is nothing without them


def _endpoint(
    i: int, raw: object, default_slots: int, api_keys: dict[Any, object], problems: Problems
) -> dict[str, object]:
    """One entry of `endpoints`, in either form, as the mapping EndpointConfig is made from:
    the url checked and split from its credentials, the defaults taken from the rest. What is
    wrong is noted in `problems`; without a usable url, ConfigError (the entry is left out)."""
    key = f"endpoints[{i}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a URL or a mapping with 'url', got {a_type(raw)}")
    raw = _known(raw, f"{key}.", accepted_keys(EndpointConfig), problems)
    if "url" not in raw:
        raise ConfigError(f"{key}: 'url' is required")
    url, basic_auth = split_userinfo(check_url(f"{key}.url", raw["url"]))
    if basic_auth is not None and raw.get("api_key"):
        problems.found.append(
            f"{key}: the url carries credentials (user:pass@) and api_key is set too; "
            f"keep one: remove the credentials from the url or drop api_key"
        )
    if url.endswith("/v1"):  # where OpenAI routes live; keep the base URL without it
        url = url[:-3]
    api_key = raw.get("api_key", api_keys.get(url) or api_keys.get(url + "/v1") or api_keys.get(str(raw["url"])))
    if api_key is not None:
        if not isinstance(api_key, str):
            problems.found.append(f"{key}.api_key: expected a string, got {a_type(api_key)}")
            api_key = None
        else:
            try:
                api_key = expand_env(api_key, f"{key}.api_key") or None
            except ConfigError as e:
                problems.found.extend(e.problems)
                api_key = None
    name = raw.get("name", default_name(url))
    return {
        **raw,
        "url": url,
        "name": name.strip() if isinstance(name, str) else name,
        "api_key": api_key,
        "max_concurrent": raw.get("max_concurrent", default_slots),
        "basic_auth": basic_auth,
    }


def _client_key(i: int, entry: object, problems: Problems) -> dict[str, object]:
    """One entry of `client_keys` as the mapping ClientKey is made from, its key checked and
    expanded. What is wrong is noted in `problems`; without a usable key, ConfigError (the
    entry is left out)."""
    where = f"client_keys[{i}]"
    if not isinstance(entry, dict):
        raise ConfigError(
            f"{where}: expected a mapping with 'name', 'key' and optional 'models', "
            f"'max_concurrent', got {a_type(entry)}"
        )
    entry = _known(entry, f"{where}.", accepted_keys(ClientKey), problems)
    name, models = entry.get("name"), entry.get("models")
    made = {**entry, "key": check_key(f"{where}.key", entry.get("key")), "models": None if models == [] else models}
    if isinstance(name, str):
        made["name"] = name.strip()
    return made


def _known(raw: dict[Any, Any], where: str, allowed: list[str], problems: Problems) -> dict[Any, Any]:
    """`raw` without its unknown keys, each noted (with the nearest valid name)."""
    with problems.check():
        refuse_unknown(where, raw, allowed)
        return raw
    return {k: v for k, v in raw.items() if k in allowed}


def _listed(problems: Problems, raw: list[object], make: Any) -> tuple[list[dict[str, object]], list[int]]:
    """`make(i, item, problems)` for each item of a list: those made, and the index in the
    file of each (an item refused here is left out, and noted, so msgspec's later messages
    name the others by their place in the file)."""
    made, at = [], []
    for i, item in enumerate(raw):
        with problems.check():
            made.append(make(i, item, problems))
            at.append(i)
    return made, at


def parse_config(data: object, source: str = "config") -> RouterConfig:
    """The configuration from a file's parsed YAML; raises ConfigError naming the key, one
    line per problem, every problem of the file."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level with an 'endpoints' list")
    problems = Problems()
    with problems.check():
        refuse_unknown("", data, [*accepted_keys(RouterConfig), *INPUT_ONLY], listed=False)
    fields = specs(RouterConfig)
    # a key given as null takes its default, unless null means something (usage_db: null is off)
    values = copy.deepcopy({k: v for k, v in data.items() if k in fields and (v is not None or fields[k].optional)})
    api_keys = data.get("api_keys") or {}
    if not isinstance(api_keys, dict):
        problems.found.append(f"api_keys: expected a mapping of endpoint URL to key, got {a_type(api_keys)}")
        api_keys = {}
    api_keys = {str(k).rstrip("/"): v for k, v in api_keys.items()}
    raw_eps = data.get("endpoints")
    if not isinstance(raw_eps, list) or not raw_eps:
        problems.found.append("endpoints: expected a non-empty list of URLs or mappings with 'url'")
        raw_eps = []
    slots = values.get("max_concurrent_connections")
    if type(slots) is not int or slots < 1:  # (a bad one is reported as itself, below)
        slots = cast(int, defaults(RouterConfig)["max_concurrent_connections"])
    places: dict[str, list[int]] = {}  # a list's items as msgspec sees them: their index in the file
    values["endpoints"], places["endpoints"] = _listed(
        problems, raw_eps, lambda i, raw, found: _endpoint(i, raw, slots, api_keys, found)
    )
    if isinstance(values.get("state"), str):  # (a deployment may choose it: the kustomize redis component)
        state = values.pop("state")
        with problems.check():
            values["state"] = expand_env(state, "state")
    for setting in _KEY_SETTINGS:
        if values.get(setting) is not None:
            with problems.check():
                values[setting] = check_key(setting, values[setting])
                continue
            del values[setting]  # (said once: not again by msgspec)
    if "client_keys" in values:
        raw_keys = values["client_keys"]
        if isinstance(raw_keys, list):
            values["client_keys"], places["client_keys"] = _listed(problems, raw_keys, _client_key)
        else:
            problems.found.append(
                "client_keys: expected a list of {name, key, models?, max_concurrent?} mappings, "
                f"got {a_type(raw_keys)}"
            )
            del values["client_keys"]
    config = _convert(values, places, problems)
    if config is None:
        problems.raise_any()
        raise ConfigError("config: not valid")  # (msgspec said nothing the router could place)
    with problems.check():
        _check_names(config)
    with problems.check():
        one_holder_per_key(
            [(s, getattr(config, s)) for s in _KEY_SETTINGS if getattr(config, s) is not None]
            + [(f"client_keys '{c.name}'", c.key) for c in config.client_keys if c.key]
        )
    with problems.check():
        _check_cache(config)
    problems.raise_any()
    return config


def _convert(values: dict[str, Any], places: dict[str, list[int]], problems: Problems) -> RouterConfig | None:
    """`values` as a RouterConfig, every key msgspec refuses noted and taken out (its default
    stands in for the checks that follow); None when a refusal cannot be taken out."""
    for _ in range(MAX_ROUNDS):
        try:
            return msgspec.convert(values, RouterConfig, strict=True)
        except msgspec.ValidationError as e:
            problem = str(explain(e, RouterConfig, values))
            steps = error_path(e)
            if steps and isinstance(steps[0], str) and len(steps) > 1 and isinstance(steps[1], int):
                at = places.get(steps[0])
                if at is not None and steps[1] < len(at):  # name the item by its place in the file
                    problem = re.sub(r"^(\w+)\[\d+\]", f"\\1[{at[steps[1]]}]", problem)
            problems.found.append(problem)
            if not steps or not _take_out(values, steps, places):
                return None
    return None


def _take_out(values: dict[str, Any], steps: list[str | int], places: dict[str, list[int]]) -> bool:
    """Remove what msgspec refused at `steps`: the key (a list of values wrong in one goes
    whole), or the entry of `endpoints` or `client_keys` that is wrong as a whole or in a
    required key. False when there is nothing to remove (the file's top level, or the last
    endpoint)."""
    holder: dict[str, Any] | None = None
    key, node, item = "", cast(Any, values), None
    for step in steps:
        if isinstance(step, str):
            if not isinstance(node, dict) or step not in node:
                return False
            holder, key, node = node, step, node[step]
        else:
            if not isinstance(node, list) or step >= len(node):
                return False
            if holder is values and item is None:
                item = (key, step)
            node = node[step]
    entry = item is not None and item[0] in places and (isinstance(steps[-1], int) or key in _REQUIRED)
    if item is not None and entry:  # that entry goes, and its place
        listed, index = item
        if listed == "endpoints" and len(values[listed]) == 1:
            return False
        del values[listed][index]
        del places[listed][index]
        return True
    if holder is None or (holder is values and key in places):
        return False
    del holder[key]
    return True


def _check_names(config: RouterConfig) -> None:
    """Unique endpoint and client names, none of the reserved ones."""
    problems = Problems()
    names = [e.name for e in config.endpoints]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.found.append(f"endpoints: names must be unique; give each a 'name' ({dupes} repeat)")
    clients = [c.name for c in config.client_keys]
    if _RESERVED & set(clients):
        problems.found.append(
            "client_keys: the names 'default', 'admin' and 'metrics' are reserved "
            "(router_api_key, admin_key and metrics_key); choose another name"
        )
    if len(set(clients)) != len(clients):
        problems.found.append("client_keys: names must be unique (they name the client in usage and logs)")
    problems.raise_any()


def _check_cache(config: RouterConfig) -> None:
    """What the cache's keys mean together: a redis backend needs a server, semantic mode an
    embedding model."""
    cache = config.cache
    if not cache.enabled:
        return
    if cache.backend == "redis" and cache.url is None and not config.state.startswith(("redis", "unix")):
        raise ConfigError(
            "cache.backend: redis needs a server: set cache.url (redis://host:6379/0) or use state: redis://..."
        )
    if cache.similarity < 1.0 and cache.embed_model is None:
        raise ConfigError(
            f"cache.similarity: {cache.similarity:g} turns semantic mode on, which needs "
            "cache.embed_model (an embedding model your endpoints serve)"
        )


def load_config(path: str) -> RouterConfig:
    """The configuration in the YAML file at `path`; raises ConfigError with every problem."""
    data, twice = read(path)
    try:
        config = parse_config(data, path)
    except ConfigError as e:
        raise ConfigError("\n".join([*twice, *e.problems])) from None
    if twice:
        raise ConfigError("\n".join(twice))
    return config
