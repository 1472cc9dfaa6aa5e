"""The router's configuration: every key declared once, in this package, loaded once at start.

Each key is a field of a msgspec Struct with its type, default, bounds and one line of
documentation; msgspec checks types and bounds, docs/configuration.md is generated from the
same declaration (`python -m nomyo_router.config_doc`), so the code, the checks and the
reference cannot drift apart. What msgspec cannot say (URL shapes, key strength, one key one
holder, unique names) is checked explicitly in `load.py` and in `config_checks.py`.

Both the documented form and NOMYO's original form (a plain list of URLs in `endpoints`, an
`api_keys` map keyed by URL) are accepted. Every error names the key, the value (never a
secret's) and what is expected, and stops start-up.

One module a job: `declare` (how a key is declared, the shared value shapes), `backends`
(an entry of `endpoints`), `clients` (an entry of `client_keys`), `sections` (the `tracing`,
`cache` and `moe` mappings), `router` (the top-level keys) and `load` (file to RouterConfig).
Importers use the names below, from `nomyo_router.config`.
"""

from ..config_checks import ConfigError, digest_of, expand_env, redact_url, split_userinfo
from .backends import ENDPOINT_TYPES, EndpointConfig
from .clients import ClientKey
from .load import CONFIG_ENV, SUPERVISOR_ENV, load_config, parse_config
from .router import INPUT_ONLY, ROUTING_POLICIES, RouterConfig
from .sections import BatchConfig, CacheConfig, MoeConfig, TracingConfig

__all__ = [
    "CONFIG_ENV",
    "ENDPOINT_TYPES",
    "INPUT_ONLY",
    "ROUTING_POLICIES",
    "SUPERVISOR_ENV",
    "BatchConfig",
    "CacheConfig",
    "ClientKey",
    "ConfigError",
    "EndpointConfig",
    "MoeConfig",
    "RouterConfig",
    "TracingConfig",
    "digest_of",
    "expand_env",
    "load_config",
    "parse_config",
    "redact_url",
    "split_userinfo",
]
