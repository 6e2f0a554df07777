"""vLLM's own code as implementations, each checked thing side by side: rotation.py
(``MRotaryEmbedding.forward_native`` / ``.forward_cuda``, ``XDRotaryEmbedding``), position_step.py
(Model Runner V2's position step), position_ids.py (the model's ``get_rope_index`` through vLLM's
processor inputs).  Nothing is imported here: each module needs vLLM only when it is used."""

# Its modules: nothing is imported here.
__all__ = ["omni_position_ids", "position_ids", "position_step", "rotation"]
