"""The file formats a run is kept in: the checkpoint (``checkpoint``: one typed record of a run, read,
upgraded and written there only) and the pretrained folder (``pretrained``: safetensors weights beside a
JSON config and a model card, the Hugging Face Hub's layout). Above the models and the samplers, whose
code takes weights and settings, never files; below training, evaluation, export and the API."""
