"""webui_model."""
