"""transformers' own code as implementations, each checked thing side by side: rotation.py (each
family's rotary module and rotation function), position_ids.py (its ``get_rope_index``) and table.py
(ROPE_INIT_FUNCTIONS and the rotary modules' cos/sin).
Nothing is imported here: each module needs transformers only when it is used."""

# Its modules: nothing is imported here.
__all__ = ["omni_position_ids", "position_ids", "rotation", "table"]
