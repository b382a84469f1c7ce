"""The model code of a Hugging Face export (``lockstep export --format hf``), shipped as files.

``configuration_lockstep.py`` and ``modeling_lockstep.py`` are copied byte for byte into
every Hugging Face export, where ``transformers`` loads them with ``trust_remote_code=True``.
They import only ``torch`` and ``transformers``, never lockstep, so an export runs where
lockstep is not installed; lockstep itself never imports them (``export_hf`` reads their
bytes, ``verify-export`` compares an export's copies with these).
"""
