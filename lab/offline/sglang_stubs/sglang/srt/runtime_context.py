"""Stands in for ``sglang/srt/runtime_context.py`` (sglang 0.5.23) in the trimmed carry
(lab/offline/sglang_carry.sh).

In SGLang this is the engine's store of its published configuration (built on msgspec).  The
harness builds rotary modules with no engine around them, so here nothing is ever published, and
the three names the carried modules import say so: ``publish_role()`` is None, and
``get_exec()`` / ``attention_backends()`` raise ValueError, the error SGLang gives when asked for a
configuration before an engine has published one.
"""

_NOTHING_PUBLISHED = "no engine configuration is published in the trimmed SGLang carry (.sgl)"


def publish_role():
    return None


def get_exec():
    raise ValueError(_NOTHING_PUBLISHED)


def attention_backends():
    raise ValueError(_NOTHING_PUBLISHED)
