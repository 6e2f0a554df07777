"""The float64 reference against independent rules and against transformers."""
