"""A campaign's settings, read by the command that runs it (rope.harness.campaign) and by the plugin
inside each of its pytest sessions (the ``campaign`` Hypothesis profile, the rounds): the environment
variables a campaign sets for its sessions, and what a session reads back from them.  The plugin reads
them here, never from the command."""

from __future__ import annotations

__all__ = ["BATCHES_ENV", "CAMPAIGN_BATCHES", "CAMPAIGN_ENV", "DATABASE_ENV", "EXAMPLES_ENV", "ROUNDS_ENV",
           "SHARED_DATABASE_ENV", "campaign_batches", "campaign_profile", "campaign_rounds"]

CAMPAIGN_ENV = "ROPE_CAMPAIGN"                 # set in the rounds: conftest records, the campaign merges
EXAMPLES_ENV = "ROPE_CAMPAIGN_EXAMPLES"        # examples per test outside the rounds (the campaign profile)
ROUNDS_ENV = "ROPE_CAMPAIGN_ROUNDS"            # a session's rounds: "examples:seed,examples:seed,..."
DATABASE_ENV = "ROPE_HYPOTHESIS_DB"            # the shared example database directory
SHARED_DATABASE_ENV = "ROPE_SHARED_DB"         # a Redis URL campaigns on several hosts share (--shared-db)
# How many more batches a drawn rotation case's shape serves in a campaign on a GPU (min, max): an
# example's cost is mostly Hypothesis drawing the shape and the one-case check's fixed work; further
# batches of the same shape cost a few draws and a share of one batched comparison on the device each
# (rope.harness.rotation.batch), so a campaign checks many cases per example.  Outside a campaign, and
# on the CPU (the Triton interpreter runs a program at a time), none: the suite's draws are unchanged.
# A batch's float64 comparison goes a slice of rows at a time (rope.harness.rotation.batch), so its GPU
# memory does not grow with the count, and the further batches are checked at most 127 at a time
# (rope.harness.rotation.batch.CHECKED_TOGETHER: one call deadline and one device wait each), so
# neither do their inputs.  A further batch costs a share of the example's fixed work (the shape's draw,
# its one-case check, a compile where the shape is new) plus its own call; the more of them, the fewer
# shapes a minute, the more cases each.
CAMPAIGN_BATCHES = (127, 511)
BATCHES_ENV = "ROPE_CAMPAIGN_BATCHES"          # "min,max": CAMPAIGN_BATCHES for one campaign (a probe's)

def campaign_profile(env) -> dict:
    """Settings of the ``campaign`` Hypothesis profile (registered by the plugin) for a round's
    environment: its examples per test, and the example database every worker and round shares."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    out = {"max_examples": int(env.get(EXAMPLES_ENV, "200")), "deadline": None, "print_blob": True}
    if env.get(SHARED_DATABASE_ENV):        # campaigns on several hosts: rope.harness.shared_db
        from rope.harness.shared_db import shared_database
        out["database"] = shared_database(env[SHARED_DATABASE_ENV], env.get(DATABASE_ENV))
    elif env.get(DATABASE_ENV):
        out["database"] = DirectoryBasedExampleDatabase(env[DATABASE_ENV])
    return out


def campaign_batches(env, device: str) -> tuple[int, int]:
    """(min, max) further batches per drawn rotation case: :data:`CAMPAIGN_BATCHES` (or the
    ``min,max`` of :data:`BATCHES_ENV`) in a campaign's session on a GPU, (0, 0) elsewhere."""
    if not env.get(CAMPAIGN_ENV) or device == "cpu" or device.startswith("cpu:"):
        return (0, 0)
    raw = env.get(BATCHES_ENV)
    if not raw:
        return CAMPAIGN_BATCHES
    try:
        low, high = (int(v) for v in raw.split(","))
        if not 0 <= low <= high:
            raise ValueError
    except ValueError:
        raise ValueError(f"{BATCHES_ENV}={raw!r}: must be 'min,max' with 0 <= min <= max") from None
    return low, high


def campaign_rounds(env) -> list[tuple[int, int]]:
    """A campaign session's rounds from its environment: (examples per test, seed) each."""
    raw = env.get(ROUNDS_ENV, "")
    rounds = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        examples, sep, seed = part.partition(":")
        try:
            rounds.append((int(examples), int(seed)))
            if not sep or rounds[-1][0] < 1:
                raise ValueError
        except ValueError:
            raise ValueError(f"{ROUNDS_ENV}={raw!r}: must be examples:seed pairs with examples >= 1, "
                             f"comma-separated") from None
    return rounds
