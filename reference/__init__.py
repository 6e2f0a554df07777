"""The float64 pure-PyTorch reference: plain, slow, obvious. Imports only the spec from rope/."""

from reference.positions import Image, Prompt, Text, Video, decode_positions, prompt_positions
from reference.rotation import rotate
from reference.runner import prepare_positions

__all__ = ["Image", "Prompt", "Text", "Video", "decode_positions", "prepare_positions", "prompt_positions", "rotate"]
