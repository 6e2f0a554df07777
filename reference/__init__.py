"""The float64 pure-PyTorch reference: plain, slow, obvious. Imports only the spec from rope/."""

from reference.position_ids import Image, Prompt, Text, Video, decode_positions, prompt_positions
from reference.rotation import rotate
from reference.runner_positions import prepare_positions

__all__ = ["Image", "Prompt", "Text", "Video", "decode_positions", "prepare_positions", "prompt_positions", "rotate"]
