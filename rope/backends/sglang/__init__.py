"""SGLang's own code as implementations, each checked thing side by side: rotation.py
(``MRotaryEmbedding.forward_native`` / ``.forward_triton``) and position_ids.py (its
``get_rope_index``).  Nothing is imported here: each module needs SGLang only when it is used."""

# Its modules: nothing is imported here.
__all__ = ["position_ids", "rotation"]
