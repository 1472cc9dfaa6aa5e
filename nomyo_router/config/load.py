"""Loading the configuration: a YAML file's mapping, in either form, made into RouterConfig,
with the checks a single key's declaration cannot make (one holder per key, unique names,
what the cache's keys mean together)."""

from typing import cast

import msgspec
import yaml

from ..config_checks import (
    ConfigError,
    a_type,
    accepted_keys,
    check_key,
    check_url,
    default_name,
    defaults,
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

__all__ = ["CONFIG_ENV", "SUPERVISOR_ENV", "load_config", "parse_config"]

CONFIG_ENV = "NOMYO_ROUTER_CONFIG"  # the config path, handed from `nomyo-router` to its workers
SUPERVISOR_ENV = "NOMYO_ROUTER_SUPERVISOR_PID"  # set by the CLI with several workers: POST /admin/reload signals it
_RESERVED = {"default", "admin", "metrics"}  # the client names of router_api_key, admin_key, metrics_key
_KEY_SETTINGS = ("router_api_key", "admin_key", "metrics_key")


def _endpoint(i: int, raw: object, default_slots: int, api_keys: dict[str, object]) -> dict[str, object]:
    """One entry of `endpoints`, in either form, as the mapping EndpointConfig is made from:
    the url checked and split from its credentials, the defaults taken from the rest."""
    key = f"endpoints[{i}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a URL or a mapping with 'url', got {a_type(raw)}")
    refuse_unknown(f"{key}.", raw, accepted_keys(EndpointConfig))
    if "url" not in raw:
        raise ConfigError(f"{key}: 'url' is required")
    url, basic_auth = split_userinfo(check_url(f"{key}.url", raw["url"]))
    if basic_auth is not None and raw.get("api_key"):
        raise ConfigError(
            f"{key}: the url carries credentials (user:pass@) and api_key is set too; "
            f"keep one: remove the credentials from the url or drop api_key"
        )
    if url.endswith("/v1"):  # where OpenAI routes live; keep the base URL without it
        url = url[:-3]
    api_key = raw.get("api_key", api_keys.get(url) or api_keys.get(url + "/v1") or api_keys.get(str(raw["url"])))
    if api_key is not None:
        if not isinstance(api_key, str):
            raise ConfigError(f"{key}.api_key: expected a string, got {a_type(api_key)}")
        api_key = expand_env(api_key, f"{key}.api_key") or None
    name = raw.get("name", default_name(url))
    return {
        **raw,
        "url": url,
        "name": name.strip() if isinstance(name, str) else name,
        "api_key": api_key,
        "max_concurrent": raw.get("max_concurrent", default_slots),
        "basic_auth": basic_auth,
    }


def _client_keys(raw: object) -> list[dict[str, object]]:
    """`client_keys` as the mappings ClientKey is made from, each key checked and expanded."""
    if not isinstance(raw, list):
        raise ConfigError(
            f"client_keys: expected a list of {{name, key, models?, max_concurrent?}} mappings, got {a_type(raw)}"
        )
    keys = []
    for i, entry in enumerate(raw):
        where = f"client_keys[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}: expected a mapping with 'name', 'key' and optional 'models', "
                f"'max_concurrent', got {a_type(entry)}"
            )
        refuse_unknown(f"{where}.", entry, accepted_keys(ClientKey))
        name, models = entry.get("name"), entry.get("models")
        keys.append(
            {
                **entry,
                "name": name.strip() if isinstance(name, str) else name,
                "key": check_key(f"{where}.key", entry.get("key")),
                "models": None if models == [] else models,
            }
        )
    return keys


def parse_config(data: object, source: str = "config") -> RouterConfig:
    """The configuration from a file's parsed YAML; raises ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level with an 'endpoints' list")
    refuse_unknown("", data, [*accepted_keys(RouterConfig), *INPUT_ONLY], listed=False)
    fields = specs(RouterConfig)
    # a key given as null takes its default, unless null means something (usage_db: null is off)
    values = {k: v for k, v in data.items() if k in fields and (v is not None or fields[k].optional)}
    api_keys = data.get("api_keys") or {}
    if not isinstance(api_keys, dict):
        raise ConfigError(f"api_keys: expected a mapping of endpoint URL to key, got {a_type(api_keys)}")
    api_keys = {str(k).rstrip("/"): v for k, v in api_keys.items()}
    raw_eps = data.get("endpoints")
    if not isinstance(raw_eps, list) or not raw_eps:
        raise ConfigError("endpoints: expected a non-empty list of URLs or mappings with 'url'")
    slots = values.get("max_concurrent_connections")
    if type(slots) is not int or slots < 1:  # (a bad one is reported as itself, below)
        slots = cast(int, defaults(RouterConfig)["max_concurrent_connections"])
    values["endpoints"] = [_endpoint(i, raw, slots, api_keys) for i, raw in enumerate(raw_eps)]
    if isinstance(values.get("state"), str):  # (a deployment may choose it: the kustomize redis component)
        values["state"] = expand_env(values["state"], "state")
    for setting in _KEY_SETTINGS:
        if values.get(setting) is not None:
            values[setting] = check_key(setting, values[setting])
    if "client_keys" in values:
        values["client_keys"] = _client_keys(values["client_keys"])
    try:
        config = msgspec.convert(values, RouterConfig, strict=True)
    except msgspec.ValidationError as e:
        raise explain(e, RouterConfig, values) from None
    names = [e.name for e in config.endpoints]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"endpoints: names must be unique; give each a 'name' ({dupes} repeat)")
    clients = [c.name for c in config.client_keys]
    if _RESERVED & set(clients):
        raise ConfigError(
            "client_keys: the names 'default', 'admin' and 'metrics' are reserved "
            "(router_api_key, admin_key and metrics_key); choose another name"
        )
    if len(set(clients)) != len(clients):
        raise ConfigError("client_keys: names must be unique (they name the client in usage and logs)")
    one_holder_per_key(
        [(s, getattr(config, s)) for s in _KEY_SETTINGS if getattr(config, s) is not None]
        + [(f"client_keys '{c.name}'", c.key) for c in config.client_keys if c.key]
    )
    _check_cache(config)
    return config


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
    """The configuration in the YAML file at `path`; raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; pass --config PATH or set NOMYO_ROUTER_CONFIG") from None
    except yaml.YAMLError as e:  # (where, not the line's text: the line may hold a key)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None
    return parse_config(data, path)
