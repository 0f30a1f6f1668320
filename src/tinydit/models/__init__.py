"""Architecture only: the DiT, the MMDiT, their layers and kernels, and the registry of model types."""
