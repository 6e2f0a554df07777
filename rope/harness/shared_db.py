"""The example database campaigns on several hosts share.

A campaign's workers share ``<out>/hypothesis-db`` on their host.  Campaigns on several hosts share
what they find through a Redis server (``--shared-db redis://host:6379/0``, ``rediss://`` for TLS,
``unix:///path/redis.sock``): every failure one host finds is saved there as well, and every host
replays it first in its next round.  Hypothesis's own ``RedisExampleDatabase`` (its ``redis``
extra) speaks to the server; the local directory stays the first place examples are read from and
written to, so a host that loses the server keeps its own.
"""

from __future__ import annotations

from urllib.parse import urlparse

SCHEMES = ("redis", "rediss", "unix")
KEY_PREFIX = b"rope-harness:"      # the suite's keys on a server other tools may share


def check_url(url: str) -> str:
    """``url`` if it names a Redis server, else a ValueError naming the field."""
    parsed = urlparse(url)
    if parsed.scheme not in SCHEMES or not (parsed.netloc or parsed.path):
        raise ValueError(f"shared_db={url!r}: must be a Redis URL: redis://host:port/db, rediss://... or "
                         f"unix:///path/to/redis.sock")
    return url


def shared_database(url: str, local_dir: str | None = None):
    """The database a round uses: the local directory (when given) and the Redis server at ``url``,
    every example saved to both and read from both."""
    from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase
    check_url(url)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise ValueError(f"shared_db={url!r}: the redis package is not installed (pip install redis)") from None
    remote = RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=KEY_PREFIX)
    if local_dir is None:
        return remote
    return MultiplexedDatabase(DirectoryBasedExampleDatabase(local_dir), remote)
